//! Reading log files: gzip detection, format detection, line numbers, malformed-line
//! accounting, time ordering within a file and merging across files.
//!
//! Three levels, fastest first:
//! - [`LogReader::next_line`] / [`LogReader::for_each_record`]: file order, records borrow
//!   the line buffer (no allocation per line);
//! - [`OrderedRecords`]: records in log-time order. Web servers write a line when a
//!   request *ends* (weir: stamped with its start), so a file is only nearly sorted; records
//!   wait (in file order, or in a heap for those out of order) until the newest time seen
//!   is `reorder_window` past them. A record
//!   older than one already yielded (beyond the window) is yielded at that earlier record's
//!   time and counted as `late`, so the output never goes back in time;
//! - [`MergedRecords`]: several [`OrderedRecords`] merged by time (ties: file order).
//!
//! A record waiting in the window keeps a copy of its line, with its fields as spans of it,
//! in a slot reused once the record is out: waiting costs no allocation per record.
//! [`MergedRecords::for_each_record`] lends each record from its slot (what `weir replay`
//! uses); the iterators copy each into an owned record.
//!
//! This module does not interpret records.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::net::IpAddr;
use std::path::Path;
use std::time::Duration;

use flate2::read::MultiGzDecoder;

use super::time::{TimeLocalMemo, UnixNanos};
use super::{LogFormat, LogRecord, ParseError, Parsed, TrailingField, WeirFields, combined, json};

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// Longest excerpt of a malformed line kept as an example.
const EXAMPLE_CHARS: usize = 200;
const READ_BUFFER: usize = 256 * 1024;

/// How to read a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReaderOptions {
    /// `None`: detect from the first non-empty line.
    pub format: Option<LogFormat>,
    /// Fields after the user agent in combined logs, in order.
    pub trailing: Vec<TrailingField>,
    /// Malformed lines kept as examples (the first ones). Default 10.
    pub max_examples: usize,
    /// How far back in time a line may be and still be put in order. Default 10 s.
    pub reorder_window: Duration,
    /// Counts the bytes read from the files (before gzip decoding), for a
    /// progress bar against their sizes.
    pub bytes_read: Option<ByteCount>,
}

/// A byte counter shared with whoever shows progress; readers add to it
/// once per read of their file (a 256 KiB buffer), not per line.
#[derive(Debug, Clone, Default)]
pub struct ByteCount(pub std::sync::Arc<std::sync::atomic::AtomicU64>);

impl ByteCount {
    pub fn get(&self) -> u64 {
        self.0.load(std::sync::atomic::Ordering::Relaxed)
    }
}

impl PartialEq for ByteCount {
    fn eq(&self, other: &ByteCount) -> bool {
        std::sync::Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ByteCount {}

/// A reader that adds what it reads to a [`ByteCount`].
struct Counted<R> {
    inner: R,
    count: ByteCount,
}

impl<R: Read> Read for Counted<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count
            .0
            .fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
        Ok(n)
    }
}

impl Default for ReaderOptions {
    fn default() -> Self {
        ReaderOptions {
            format: None,
            trailing: Vec::new(),
            max_examples: 10,
            reorder_window: Duration::from_secs(10),
            bytes_read: None,
        }
    }
}

/// One malformed line, for the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MalformedLine {
    /// 1-based.
    pub line: u64,
    pub error: ParseError,
    /// The start of the line (at most 200 characters).
    pub excerpt: String,
}

/// What reading found so far.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ParseStats {
    /// Lines read, blank ones included.
    pub lines: u64,
    pub records: u64,
    /// Lines that are no request: blank, or JSON from another logger.
    pub skipped: u64,
    pub malformed: u64,
    /// Malformed counts per [`ParseError::kind`], in first-seen order.
    pub malformed_by_kind: Vec<(&'static str, u64)>,
    /// The first malformed lines.
    pub examples: Vec<MalformedLine>,
    /// Records that came later than the reorder window allowed (see [`OrderedRecords`]).
    pub late: u64,
    /// The UTC offset (seconds east) the log's first record was written
    /// in: nginx's `$time_local` carries it (`+0100`); weir's and Caddy's
    /// JSON logs are in UTC (0). Reports print times in it.
    pub utc_offset: Option<i64>,
}

impl ParseStats {
    fn malformed(&mut self, line: u64, text: &str, error: ParseError, max_examples: usize) {
        self.malformed += 1;
        let kind = error.kind();
        match self.malformed_by_kind.iter_mut().find(|(k, _)| *k == kind) {
            Some((_, n)) => *n += 1,
            None => self.malformed_by_kind.push((kind, 1)),
        }
        if self.examples.len() < max_examples {
            let excerpt = text.chars().take(EXAMPLE_CHARS).collect();
            self.examples.push(MalformedLine {
                line,
                error,
                excerpt,
            });
        }
    }
}

/// One line's outcome from [`LogReader::next_line`].
#[derive(Debug, Clone, PartialEq, Eq)]
// Boxing the record would cost an allocation per line, the one thing the fast path avoids.
#[allow(clippy::large_enum_variant)]
pub enum ParsedLine<'a> {
    Record(LogRecord<'a>),
    /// Counted in [`ParseStats::malformed`] with its line number.
    Malformed,
    /// Blank, or not a request.
    Skipped,
}

/// One line as [`LogReader::with_next_line`] lends it: the record by reference, where it
/// was parsed. A record is a few hundred bytes; handed up through the layers by value it
/// cost several copies a line.
enum Lent<'r, 'a> {
    Record(&'r LogRecord<'a>),
    Malformed,
    Skipped,
}

/// Counts a parsed line and lends it to `f`.
fn lend<'s, R>(
    stats: &mut ParseStats,
    max_examples: usize,
    number: u64,
    text: &'s str,
    parsed: Result<Option<&LogRecord<'s>>, ParseError>,
    f: impl FnOnce(Lent<'_, 's>, &'s str) -> R,
) -> R {
    match parsed {
        Ok(Some(r)) => {
            stats.records += 1;
            f(Lent::Record(r), text)
        }
        Ok(None) => {
            stats.skipped += 1;
            f(Lent::Skipped, text)
        }
        Err(e) => {
            stats.malformed(number, text, e, max_examples);
            f(Lent::Malformed, text)
        }
    }
}

/// Where a parsed line is counted: the reader's stats, the line's number,
/// and how many examples of malformed lines they keep.
struct Tally<'a> {
    stats: &'a mut ParseStats,
    max_examples: usize,
    number: u64,
}

/// What the combined format's parser reads with: the fields after its
/// standard ones, and the last timestamp it read.
struct CombinedState<'a> {
    trailing: &'a [TrailingField],
    times: &'a mut TimeLocalMemo,
}

/// Parses a non-blank line `text` as `format`, counts it and lends it to `f`
/// (noting the log's UTC offset from its first record). As `parse_line`, but
/// each parser's result is matched in place (no copy of the record).
fn parse_and_lend<'s, R>(
    format: LogFormat,
    text: &'s str,
    tally: Tally<'_>,
    state: CombinedState<'_>,
    f: impl FnOnce(Lent<'_, 's>, &'s str) -> R,
) -> R {
    let Tally {
        stats,
        max_examples: max,
        number,
    } = tally;
    match format {
        LogFormat::Combined => {
            let parsed = combined::parse(text, state.trailing, state.times);
            if parsed.is_ok() && stats.utc_offset.is_none() {
                stats.utc_offset = state.times.offset();
            }
            let parsed = match parsed {
                Ok(ref r) => Ok(Some(r)),
                Err(e) => Err(e),
            };
            lend(stats, max, number, text, parsed, f)
        }
        LogFormat::Caddy => {
            let parsed = json::parse_caddy(text);
            if matches!(parsed, Ok(Parsed::Record(_))) {
                stats.utc_offset.get_or_insert(0);
            }
            let parsed = match parsed {
                Ok(Parsed::Record(ref r)) => Ok(Some(r)),
                Ok(Parsed::Skip) => Ok(None),
                Err(e) => Err(e),
            };
            lend(stats, max, number, text, parsed, f)
        }
        LogFormat::Weir => {
            let parsed = json::parse_weir(text);
            if parsed.is_ok() {
                stats.utc_offset.get_or_insert(0);
            }
            let parsed = match parsed {
                Ok(ref r) => Ok(Some(r)),
                Err(e) => Err(e),
            };
            lend(stats, max, number, text, parsed, f)
        }
    }
}

/// Consumes the line lent last (`lent` bytes of `input`'s buffer) and reads
/// the next, without its newline: lent from the read buffer when it lies
/// whole there (`lent` then notes its length), else copied into `buf`.
/// `None` at the end of input.
fn next_line_bytes<'b>(
    input: &'b mut (dyn BufRead + Send),
    buf: &'b mut Vec<u8>,
    lent: &mut usize,
) -> io::Result<Option<&'b [u8]>> {
    input.consume(std::mem::take(lent));
    // Most lines lie whole in the read buffer and are parsed there; only
    // one crossing its end is copied out.
    let newline = {
        let available = input.fill_buf()?;
        if available.is_empty() {
            return Ok(None);
        }
        memchr::memchr(b'\n', available)
    };
    let bytes: &[u8] = match newline {
        Some(n) => {
            *lent = n + 1;
            // The buffer is not empty: this returns it again, no read.
            &input.fill_buf()?[..n]
        }
        None => {
            buf.clear();
            input.read_until(b'\n', buf)?;
            buf.strip_suffix(b"\n").unwrap_or(buf)
        }
    };
    Ok(Some(bytes))
}

/// A streaming reader of one log; see the module documentation.
pub struct LogReader {
    input: Box<dyn BufRead + Send>,
    options: ReaderOptions,
    format: Option<LogFormat>,
    /// A line that crossed the end of the read buffer is assembled here.
    buf: Vec<u8>,
    /// Bytes of the read buffer lent out as the last line, consumed at the
    /// next call (records borrow from the buffer until then).
    lent: usize,
    stats: ParseStats,
    /// The combined parser's last timestamp.
    times: TimeLocalMemo,
}

impl std::fmt::Debug for LogReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogReader")
            .field("format", &self.format)
            .field("stats", &self.stats)
            .finish()
    }
}

impl LogReader {
    /// Reads `input`, decompressing it if it starts with the gzip magic bytes.
    pub fn new<R: Read + Send + 'static>(
        input: R,
        options: ReaderOptions,
    ) -> io::Result<LogReader> {
        let mut input = BufReader::with_capacity(READ_BUFFER, input);
        let head = input.fill_buf()?;
        let input: Box<dyn BufRead + Send> = if head.starts_with(&GZIP_MAGIC) {
            Box::new(BufReader::with_capacity(
                READ_BUFFER,
                MultiGzDecoder::new(input),
            ))
        } else {
            Box::new(input)
        };
        Ok(LogReader {
            input,
            format: options.format,
            options,
            buf: Vec::with_capacity(4096),
            lent: 0,
            stats: ParseStats::default(),
            times: TimeLocalMemo::default(),
        })
    }

    /// Opens a file (plain or gzip).
    pub fn open(path: &Path, options: ReaderOptions) -> io::Result<LogReader> {
        let file = File::open(path)?;
        match options.bytes_read.clone() {
            Some(count) => LogReader::new(Counted { inner: file, count }, options),
            None => LogReader::new(file, options),
        }
    }

    /// The format in use: forced, detected, or `None` before the first non-empty line.
    pub fn format(&self) -> Option<LogFormat> {
        self.format
    }

    pub fn stats(&self) -> &ParseStats {
        &self.stats
    }

    /// The next line; `None` at the end of input. Only I/O errors are errors.
    pub fn next_line(&mut self) -> io::Result<Option<ParsedLine<'_>>> {
        self.with_next_line(|line, _| match line {
            Lent::Record(r) => ParsedLine::Record(r.clone()),
            Lent::Malformed => ParsedLine::Malformed,
            Lent::Skipped => ParsedLine::Skipped,
        })
    }

    /// Reads the next line and lends it to `f` with the text the record borrows from
    /// (empty when the line is not UTF-8); `None` at the end of input.
    fn with_next_line<'s, R>(
        &'s mut self,
        f: impl FnOnce(Lent<'_, 's>, &'s str) -> R,
    ) -> io::Result<Option<R>> {
        let Some(bytes) = next_line_bytes(&mut *self.input, &mut self.buf, &mut self.lent)? else {
            return Ok(None);
        };
        self.stats.lines += 1;
        let number = self.stats.lines;
        let max = self.options.max_examples;
        let Ok(text) = std::str::from_utf8(bytes) else {
            let lossy = String::from_utf8_lossy(bytes);
            self.stats
                .malformed(number, &lossy, ParseError::NotUtf8, max);
            return Ok(Some(f(Lent::Malformed, "")));
        };
        let format = match self.format {
            Some(f) => f,
            None => match LogFormat::detect(text) {
                Some(f) => *self.format.insert(f),
                None => {
                    self.stats.skipped += 1;
                    return Ok(Some(f(Lent::Skipped, text)));
                }
            },
        };
        let stats = &mut self.stats;
        // As `parse_line`, each parser's result matched in place (no copy of the record).
        if text.trim().is_empty() {
            return Ok(Some(lend(stats, max, number, text, Ok(None), f)));
        }
        let tally = Tally {
            stats,
            max_examples: max,
            number,
        };
        let state = CombinedState {
            trailing: &self.options.trailing,
            times: &mut self.times,
        };
        Ok(Some(parse_and_lend(format, text, tally, state, f)))
    }

    /// Calls `f` with every record, in file order, lent from the read buffer; returns at
    /// the end of input.
    pub fn for_each_record(&mut self, mut f: impl FnMut(&LogRecord<'_>)) -> io::Result<()> {
        while self
            .with_next_line(|line, _| {
                if let Lent::Record(r) = line {
                    f(r);
                }
            })?
            .is_some()
        {}
        Ok(())
    }

    /// The records in log-time order.
    pub fn ordered(self) -> OrderedRecords {
        OrderedRecords {
            window: self.options.reorder_window,
            reader: self,
            slots: Vec::new(),
            free: Vec::new(),
            waiting: WaitQueue::default(),
            newest: None,
            last_out: None,
            done: false,
        }
    }
}

/// A string field of a parked record: a span of its slot's text. A field that does not
/// borrow from the line (a JSON value whose escapes were decoded) is appended to the text,
/// so every field is a span. Spans are cut on character boundaries.
#[derive(Debug, Clone, Copy)]
struct Field {
    start: u32,
    end: u32,
}

impl Field {
    /// Lines longer than 4 GB are not access-log lines: their spans saturate (and read
    /// back empty) rather than wrap.
    fn span(start: usize, end: usize) -> Field {
        Field {
            start: u32::try_from(start).unwrap_or(u32::MAX),
            end: u32::try_from(end).unwrap_or(u32::MAX),
        }
    }

    /// `value`, appended to `text`.
    fn appended(text: &mut String, value: &str) -> Field {
        let start = text.len();
        text.push_str(value);
        Field::span(start, text.len())
    }

    fn get(self, text: &str) -> Cow<'_, str> {
        Cow::Borrowed(
            text.get(self.start as usize..self.end as usize)
                .unwrap_or_default(),
        )
    }
}

/// A record waiting in the reorder window: a copy of its line and its fields as spans of
/// it. The slot (and its text's allocation) is reused once the record is out.
#[derive(Debug)]
struct Parked {
    text: String,
    time: UnixNanos,
    client: IpAddr,
    peer: Option<IpAddr>,
    status: u16,
    bytes: u64,
    method: Field,
    host: Option<Field>,
    target: Field,
    user_agent: Option<Field>,
    referer: Option<Field>,
    cookie: Option<Field>,
    accept: Option<Field>,
    sec_fetch_mode: Option<Field>,
    forwarded_for: Option<Field>,
    weir: Option<(Field, Field, Option<Field>)>,
    visit: Option<weir::observe::access_log::LoggedVisit>,
}

impl Parked {
    /// A slot holding `record`, parsed from `line`.
    fn new(line: &str, record: &LogRecord<'_>) -> Parked {
        let empty = Field::span(0, 0);
        let mut parked = Parked {
            text: String::new(),
            time: record.time,
            client: record.client,
            peer: None,
            status: 0,
            bytes: 0,
            method: empty,
            host: None,
            target: empty,
            user_agent: None,
            referer: None,
            cookie: None,
            accept: None,
            sec_fetch_mode: None,
            forwarded_for: None,
            weir: None,
            visit: None,
        };
        parked.fill(line, record);
        parked
    }

    /// Parks `record`, parsed from `line`, in place of what the slot held (its text's
    /// allocation is reused).
    fn fill(&mut self, line: &str, record: &LogRecord<'_>) {
        let text = &mut self.text;
        text.clear();
        text.push_str(line);
        // Borrowed fields point into `line`; find them in the copy by offset.
        let shift = |v: &str| -> Option<usize> {
            (v.as_ptr() as usize)
                .checked_sub(line.as_ptr() as usize)
                .filter(|o| o + v.len() <= line.len())
        };
        let f = |text: &mut String, v: &Cow<'_, str>| -> Field {
            match (v, shift(v)) {
                (Cow::Borrowed(_), Some(o)) => Field::span(o, o + v.len()),
                _ => Field::appended(text, v),
            }
        };
        self.method = f(text, &record.method);
        self.host = record.host.as_ref().map(|v| f(text, v));
        self.target = f(text, &record.target);
        self.user_agent = record.user_agent.as_ref().map(|v| f(text, v));
        self.referer = record.referer.as_ref().map(|v| f(text, v));
        self.cookie = record.cookie.as_ref().map(|v| f(text, v));
        self.accept = record.accept.as_ref().map(|v| f(text, v));
        self.sec_fetch_mode = record.sec_fetch_mode.as_ref().map(|v| f(text, v));
        self.forwarded_for = record.forwarded_for.as_ref().map(|v| f(text, v));
        self.weir = record.weir.as_ref().map(|w| {
            (
                f(text, &w.class),
                f(text, &w.decision),
                w.rule.as_ref().map(|v| f(text, v)),
            )
        });
        self.visit = record.weir.as_ref().and_then(|w| w.visit);
        self.time = record.time;
        self.client = record.client;
        self.peer = record.peer;
        self.status = record.status;
        self.bytes = record.bytes;
    }

    /// The record, borrowing from the slot.
    fn record(&self) -> LogRecord<'_> {
        let text = self.text.as_str();
        let o = |f: Option<Field>| f.map(|f| f.get(text));
        LogRecord {
            time: self.time,
            client: self.client,
            peer: self.peer,
            method: self.method.get(text),
            host: o(self.host),
            target: self.target.get(text),
            status: self.status,
            bytes: self.bytes,
            user_agent: o(self.user_agent),
            referer: o(self.referer),
            cookie: o(self.cookie),
            accept: o(self.accept),
            sec_fetch_mode: o(self.sec_fetch_mode),
            forwarded_for: o(self.forwarded_for),
            weir: self.weir.map(|(class, decision, rule)| WeirFields {
                class: class.get(text),
                decision: decision.get(text),
                rule: o(rule),
                visit: self.visit,
            }),
        }
    }
}

/// A parked record's place in line: (time, line number, slot).
type Waiting = (UnixNanos, u64, usize);

/// Parked records in (time, line) order. Logs are nearly in order, so a
/// record not before the last one queued joins the back of a FIFO (O(1));
/// only records that arrive out of order go through a heap.
#[derive(Debug, Default)]
struct WaitQueue {
    in_order: VecDeque<Waiting>,
    stragglers: BinaryHeap<Reverse<Waiting>>,
}

impl WaitQueue {
    fn push(&mut self, w: Waiting) {
        match self.in_order.back() {
            Some(last) if w < *last => self.stragglers.push(Reverse(w)),
            _ => self.in_order.push_back(w),
        }
    }

    /// True when the next record comes from the heap.
    fn straggler_first(&self) -> bool {
        match (self.in_order.front(), self.stragglers.peek()) {
            (Some(a), Some(Reverse(b))) => b < a,
            (None, Some(_)) => true,
            _ => false,
        }
    }

    fn peek(&self) -> Option<Waiting> {
        if self.straggler_first() {
            self.stragglers.peek().map(|Reverse(w)| *w)
        } else {
            self.in_order.front().copied()
        }
    }

    fn pop(&mut self) -> Option<Waiting> {
        if self.straggler_first() {
            self.stragglers.pop().map(|Reverse(w)| w)
        } else {
            self.in_order.pop_front()
        }
    }
}

/// Records of one log in time order; see the module documentation.
pub struct OrderedRecords {
    reader: LogReader,
    window: Duration,
    /// Parked records; `free` lists the slots not in use.
    slots: Vec<Parked>,
    free: Vec<usize>,
    /// Parked records by (time, line number): ties in file order.
    waiting: WaitQueue,
    newest: Option<UnixNanos>,
    last_out: Option<UnixNanos>,
    done: bool,
}

impl OrderedRecords {
    /// Counts so far (including `late`).
    pub fn stats(&self) -> &ParseStats {
        &self.reader.stats
    }

    pub fn format(&self) -> Option<LogFormat> {
        self.reader.format
    }

    fn ready(&self) -> bool {
        let Some((time, _, _)) = self.waiting.peek() else {
            return false;
        };
        if self.done {
            return true;
        }
        self.newest
            .is_some_and(|newest| time <= newest.saturating_sub(self.window))
    }

    fn pull(&mut self) -> io::Result<()> {
        let (slots, free) = (&mut self.slots, &mut self.free);
        let parked = self.reader.with_next_line(|line, text| {
            let Lent::Record(record) = line else {
                return None;
            };
            Some(match free.pop() {
                Some(slot) => {
                    slots[slot].fill(text, record);
                    slot
                }
                None => {
                    slots.push(Parked::new(text, record));
                    slots.len() - 1
                }
            })
        })?;
        let Some(parked) = parked else {
            self.done = true;
            return Ok(());
        };
        let Some(slot) = parked else {
            return Ok(());
        };
        let line = self.reader.stats.lines;
        let parked = &mut self.slots[slot];
        self.newest = Some(self.newest.map_or(parked.time, |n| n.max(parked.time)));
        if let Some(last) = self.last_out
            && parked.time < last
        {
            self.reader.stats.late += 1;
            parked.time = last;
        }
        self.waiting.push((parked.time, line, slot));
        Ok(())
    }

    /// The slot of the next record in time order, out of the heap; the caller reads it
    /// and then [`OrderedRecords::release`]s it.
    fn next_slot(&mut self) -> Option<io::Result<usize>> {
        loop {
            if self.ready() {
                let (time, _, slot) = self.waiting.pop()?;
                self.last_out = Some(time);
                return Some(Ok(slot));
            }
            if self.done {
                return None;
            }
            if let Err(e) = self.pull() {
                // An I/O error ends this file; what was read is still yielded first.
                self.done = true;
                return Some(Err(e));
            }
        }
    }

    fn release(&mut self, slot: usize) {
        self.free.push(slot);
    }
}

impl Iterator for OrderedRecords {
    type Item = io::Result<LogRecord<'static>>;

    fn next(&mut self) -> Option<Self::Item> {
        let slot = match self.next_slot()? {
            Ok(slot) => slot,
            Err(e) => return Some(Err(e)),
        };
        let record = self.slots[slot].record().into_owned();
        self.release(slot);
        Some(Ok(record))
    }
}

/// Several logs merged by time; yields `(source index, record)`.
pub struct MergedRecords {
    sources: Vec<OrderedRecords>,
    heads: BinaryHeap<Reverse<(UnixNanos, usize)>>,
    /// Each source's head record: its slot in that source.
    pending: Vec<Option<usize>>,
    started: bool,
}

impl MergedRecords {
    pub fn new(sources: Vec<OrderedRecords>) -> MergedRecords {
        let pending = sources.iter().map(|_| None).collect();
        MergedRecords {
            sources,
            heads: BinaryHeap::new(),
            pending,
            started: false,
        }
    }

    /// Each source's counts, in the order given.
    pub fn stats(&self) -> Vec<&ParseStats> {
        self.sources.iter().map(|s| s.stats()).collect()
    }

    /// Loads the next record of `i` into its head slot.
    fn refill(&mut self, i: usize) -> io::Result<()> {
        if let Some(next) = self.sources[i].next_slot() {
            let slot = next?;
            self.heads
                .push(Reverse((self.sources[i].slots[slot].time, i)));
            self.pending[i] = Some(slot);
        }
        Ok(())
    }

    fn start(&mut self) -> io::Result<()> {
        if !self.started {
            self.started = true;
            for i in 0..self.sources.len() {
                self.refill(i)?;
            }
        }
        Ok(())
    }

    /// The source and slot of the next record, out of the heads.
    fn next_head(&mut self) -> Option<(usize, usize)> {
        let Reverse((_, i)) = self.heads.pop()?;
        Some((i, self.pending[i].take()?))
    }

    /// Calls `f` with every record and its source index, in time order, lending each
    /// record from its slot (no copy); returns at the end of every input. `f` also
    /// gets the client of the record that comes next, already parked, so it can warm
    /// what that record will look up while it works on this one.
    pub fn for_each_record(
        &mut self,
        mut f: impl FnMut(usize, &LogRecord<'_>, Option<IpAddr>),
    ) -> io::Result<()> {
        self.start()?;
        while let Some((i, slot)) = self.next_head() {
            // The next record of this source is parked first (this one's slot stays
            // taken until it is released), so the one after this is known.
            let refilled = self.refill(i);
            let next = self.heads.peek().and_then(|Reverse((_, j))| {
                let parked = &self.sources[*j].slots[self.pending[*j]?];
                // Parked a reorder window ago: its line has left the cache.
                weir_limiter::prefetch::prefetch(parked.text.as_str(), parked.text.len());
                Some(parked.client)
            });
            f(i, &self.sources[i].slots[slot].record(), next);
            self.sources[i].release(slot);
            refilled?;
        }
        Ok(())
    }
}

impl Iterator for MergedRecords {
    type Item = io::Result<(usize, LogRecord<'static>)>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Err(e) = self.start() {
            return Some(Err(e));
        }
        let (i, slot) = self.next_head()?;
        let record = self.sources[i].slots[slot].record().into_owned();
        self.sources[i].release(slot);
        if let Err(e) = self.refill(i) {
            return Some(Err(e));
        }
        Some(Ok((i, record)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn combined(ip: &str, secs: u32, path: &str) -> String {
        let (m, s) = (secs / 60, secs % 60);
        format!(
            "{ip} - - [10/Oct/2026:13:{m:02}:{s:02} +0000] \"GET {path} HTTP/1.1\" 200 1 \"-\" \"ua\"\n"
        )
    }

    fn reader(text: &str, options: ReaderOptions) -> LogReader {
        LogReader::new(io::Cursor::new(text.as_bytes().to_vec()), options).expect("in memory")
    }

    #[test]
    fn malformed_lines_are_counted_with_numbers() {
        let text = [
            combined("10.0.0.1", 0, "/a"),
            "\n".into(),
            "junk line\n".into(),
            combined("10.0.0.2", 1, "/b"),
            "10.0.0.3 - - [bad] \"GET / HTTP/1.1\" 200 1 \"-\" \"ua\"\n".into(),
            combined("10.0.0.4", 2, "/c").trim_end().to_string(), // no final newline
        ]
        .concat();
        let mut r = reader(
            &text,
            ReaderOptions {
                max_examples: 1,
                ..Default::default()
            },
        );
        let mut targets = Vec::new();
        r.for_each_record(|rec| targets.push(rec.target.to_string()))
            .expect("read");
        assert_eq!(targets, ["/a", "/b", "/c"]);
        let s = r.stats();
        assert_eq!((s.lines, s.records, s.skipped, s.malformed), (6, 3, 1, 2));
        assert_eq!(s.malformed_by_kind, [("bad_address", 1), ("bad_time", 1)]);
        assert_eq!(s.examples.len(), 1, "only the first example is kept");
        assert_eq!(
            (s.examples[0].line, s.examples[0].excerpt.as_str()),
            (3, "junk line")
        );
    }

    #[test]
    fn not_utf8_is_malformed_not_fatal() {
        let mut bytes = combined("10.0.0.1", 0, "/a").into_bytes();
        bytes.extend_from_slice(b"\xff\xfe broken\n");
        bytes.extend_from_slice(combined("10.0.0.1", 1, "/b").as_bytes());
        let mut r = LogReader::new(io::Cursor::new(bytes), ReaderOptions::default()).expect("mem");
        let mut n = 0;
        r.for_each_record(|_| n += 1).expect("read");
        assert_eq!(n, 2);
        assert_eq!(r.stats().examples[0].line, 2);
        assert_eq!(r.stats().examples[0].error, ParseError::NotUtf8);
    }

    #[test]
    fn format_detection_and_forcing() {
        let caddy = r#"{"level":"info","ts":1791608136.5,"logger":"http.log.access","msg":"handled request","request":{"remote_ip":"10.0.0.1","method":"GET","host":"h","uri":"/x","headers":{}},"status":200,"size":1}"#;
        let weir = r#"{"time":"2026-10-10T04:55:36.123Z","client":"10.0.0.1","peer":"10.0.0.1","method":"GET","host":"h","path":"/y","status":200,"class":"page","decision":"admit","rule":null}"#;
        let cases: &[(String, Option<LogFormat>, Option<LogFormat>, u64)] = &[
            (format!("\n{caddy}\n"), None, Some(LogFormat::Caddy), 1),
            (format!("{weir}\n"), None, Some(LogFormat::Weir), 1),
            (
                combined("10.0.0.1", 0, "/a"),
                None,
                Some(LogFormat::Combined),
                1,
            ),
            (
                format!("{caddy}\n"),
                Some(LogFormat::Combined),
                Some(LogFormat::Combined),
                0,
            ),
            ("\n\n".into(), None, None, 0),
        ];
        for (text, forced, want, records) in cases {
            let mut r = reader(
                text,
                ReaderOptions {
                    format: *forced,
                    ..Default::default()
                },
            );
            r.for_each_record(|_| {}).expect("read");
            assert_eq!((r.format(), r.stats().records), (*want, *records), "{text}");
        }
        assert_eq!("nginx".parse(), Ok(LogFormat::Combined));
        assert!("csv".parse::<LogFormat>().is_err());
    }

    #[test]
    fn gzip_round_trip() {
        let text: String = (0..500)
            .map(|i| combined("10.0.0.1", i % 3600, &format!("/p{i}")))
            .collect();
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(text.as_bytes()).expect("compress");
        let compressed = gz.finish().expect("finish");
        assert_eq!(compressed[..2], GZIP_MAGIC);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("access.log.gz");
        std::fs::write(&path, &compressed).expect("write");
        let read = |r: &mut LogReader| {
            let mut v = Vec::new();
            r.for_each_record(|rec| v.push(rec.clone().into_owned()))
                .expect("read");
            v
        };
        let from_gz = read(&mut LogReader::open(&path, ReaderOptions::default()).expect("open"));
        let from_plain = read(&mut reader(&text, ReaderOptions::default()));
        assert_eq!(from_gz.len(), 500);
        assert_eq!(from_gz, from_plain);
    }

    #[test]
    fn ordered_within_the_window_and_late_records_clamped() {
        // Seconds: 5, 3 (within a 10 s window), 20, 1 (too late: 19 s after 20 was seen).
        let text = [
            combined("10.0.0.1", 5, "/5"),
            combined("10.0.0.1", 3, "/3"),
            combined("10.0.0.1", 20, "/20"),
            combined("10.0.0.1", 30, "/30"),
            combined("10.0.0.1", 1, "/1"),
            combined("10.0.0.1", 30, "/30b"),
        ]
        .concat();
        let r = reader(&text, ReaderOptions::default());
        let mut ordered = r.ordered();
        let got: Vec<(String, i64)> = (&mut ordered)
            .map(|rec| rec.expect("in memory"))
            .map(|rec| (rec.target.into_owned(), rec.time.as_secs() % 60))
            .collect();
        let want: Vec<(String, i64)> = [
            ("/3", 3),
            ("/5", 5),
            ("/20", 20),
            ("/1", 20),
            ("/30", 30),
            ("/30b", 30),
        ]
        .iter()
        .map(|(p, t)| (p.to_string(), *t))
        .collect();
        assert_eq!(got, want);
        assert_eq!(ordered.stats().late, 1);
    }

    #[test]
    fn wait_queue_yields_in_time_then_line_order() {
        // Nearly sorted times with stragglers and ties, pushed and popped
        // interleaved as the reader does.
        let mut x = 0x2545_f491_u64;
        let mut q = WaitQueue::default();
        let (mut pushed, mut popped) = (Vec::new(), Vec::new());
        for line in 0..2000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let jitter = if x.is_multiple_of(5) { x % 7 } else { 0 };
            let w = (UnixNanos((line / 3 - jitter.min(line / 3)) as i64), line, 0);
            q.push(w);
            pushed.push(w);
            if x.is_multiple_of(3) {
                popped.extend(q.pop());
            }
        }
        while let Some(w) = q.pop() {
            popped.push(w);
        }
        // The model: one heap given the same pushes and pops.
        let mut model = BinaryHeap::new();
        let mut want = Vec::new();
        let mut x = 0x2545_f491_u64;
        for w in &pushed {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            model.push(Reverse(*w));
            if x.is_multiple_of(3) {
                want.extend(model.pop().map(|Reverse(w)| w));
            }
        }
        while let Some(Reverse(w)) = model.pop() {
            want.push(w);
        }
        assert_eq!(popped, want);
    }

    #[test]
    fn parked_records_read_back_as_parsed() {
        // Escaped JSON values are decoded into owned strings; parking must keep them too.
        let caddy = |ts: u32, uri: &str, ua: &str| {
            format!(
                "{{\"level\":\"info\",\"ts\":{ts}.5,\"logger\":\"http.log.access\",\"msg\":\"handled request\",\"request\":{{\"remote_ip\":\"10.0.0.1\",\"method\":\"GET\",\"host\":\"h\",\"uri\":\"{uri}\",\"headers\":{{\"User-Agent\":[\"{ua}\"],\"Cookie\":[\"s=1\"]}}}},\"status\":200,\"size\":1}}\n"
            )
        };
        let cases: Vec<String> = vec![
            [
                combined("10.0.0.1", 5, "/b"),
                combined("10.0.0.2", 3, "/a?x=1"),
            ]
            .concat(),
            [
                caddy(1_791_608_136, "/plain", "ua"),
                caddy(1_791_608_135, "/esc\\u0041\\/x", "say \\\"hi\\\""),
            ]
            .concat(),
        ];
        for (i, text) in cases.iter().enumerate() {
            let mut want = Vec::new();
            reader(text, ReaderOptions::default())
                .for_each_record(|r| want.push(r.clone().into_owned()))
                .expect("read");
            want.sort_by_key(|r| r.time);
            assert_eq!(want.len(), 2, "case {i}");
            let iterated: Vec<LogRecord<'static>> = reader(text, ReaderOptions::default())
                .ordered()
                .map(|r| r.expect("in memory"))
                .collect();
            let mut lent = Vec::new();
            MergedRecords::new(vec![reader(text, ReaderOptions::default()).ordered()])
                .for_each_record(|_, r, _| lent.push(r.clone().into_owned()))
                .expect("in memory");
            assert_eq!(iterated, want, "case {i}: iterator");
            assert_eq!(lent, want, "case {i}: lent");
        }
    }

    #[test]
    fn merge_orders_across_files() {
        let a: String = [0, 2, 4, 6]
            .iter()
            .map(|s| combined("10.0.0.1", *s, &format!("/a{s}")))
            .collect();
        let b: String = [1, 2, 3, 7, 8]
            .iter()
            .map(|s| combined("10.0.0.2", *s, &format!("/b{s}")))
            .collect();
        let c = "".to_string();
        let sources = [a, b, c]
            .iter()
            .map(|t| reader(t, ReaderOptions::default()).ordered())
            .collect();
        let merged: Vec<(usize, String)> = MergedRecords::new(sources)
            .map(|r| r.expect("in memory"))
            .map(|(i, rec)| (i, rec.target.into_owned()))
            .collect();
        let want = [
            (0, "/a0"),
            (1, "/b1"),
            (0, "/a2"),
            (1, "/b2"),
            (1, "/b3"),
            (0, "/a4"),
            (0, "/a6"),
            (1, "/b7"),
            (1, "/b8"),
        ];
        let want: Vec<(usize, String)> = want.iter().map(|(i, s)| (*i, s.to_string())).collect();
        assert_eq!(merged, want);
    }
}
