//! The hand-off channel between an old and a new weir process: framed
//! messages over a Unix stream socket, listening sockets passed as
//! `SCM_RIGHTS` ancillary data, limiter state as a snapshot blob.
//!
//! Frames are `u32` little-endian length, one kind byte, payload. Kind `J` is
//! a JSON [`Message`]; kind `B` is a blob (the bytes of a limiter snapshot
//! file, written and read by the same `Snapshot::write_to`/`read_from` code
//! as the on-disk snapshot, so there is one encoding). File descriptors ride
//! on the [`Message::Sockets`] frame; every frame is read with `recvmsg`, so
//! descriptors are never dropped by a plain `read`, and they arrive with
//! `CLOEXEC` set so a later child does not inherit strays.
//!
//! The conversation of an upgrade (old = running process, new = its child):
//!
//! ```text
//! new → old  Take { pid }             (old checks the peer's pid: its own child)
//! old → new  Sockets { .. } + fds     (the same listening sockets, not copies,
//!                                      and the pools' learned admission limits)
//! old → new  blob: limiter snapshot   (empty = no state)
//! new → old  Ready { .. }             (new is accepting on every socket)
//! old → new  Committed                (old has stopped accepting; drains)
//! old → new  blob: final snapshot     (after the drain; merged by max TAT)
//! ```
//!
//! and of `weir upgrade`: `Upgrade` → `UpgradeResult`.
//!
//! Uses `rustix`'s safe `sendmsg`/`recvmsg`, which hand back `OwnedFd`s: no
//! `unsafe` here. This module does not decide *when* to hand off (see
//! `upgrade`) nor what a socket is for (see `inherit`).

use std::io::{self, IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;
use std::time::Duration;

use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags,
};
use serde::{Deserialize, Serialize};
use tokio::io::Interest;
use tokio::net::UnixStream;

use super::inherit::SocketRole;
use crate::admission::PoolLimit;
use weir_limiter::{Snapshot, SnapshotError};

/// Largest frame accepted (a snapshot is 16 bytes a key: 64M keys).
const MAX_FRAME: usize = 1 << 30;
/// Most descriptors in one hand-off (the kernel allows 253 per message).
pub const MAX_FDS: usize = 64;

/// A hand-off that failed; says which step and, for a peer's refusal, why.
#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    #[error("upgrade socket {path}: cannot connect: {source}")]
    Connect { path: String, source: io::Error },
    #[error("hand-off channel: {action}: {source}")]
    Io {
        action: &'static str,
        source: io::Error,
    },
    #[error("hand-off channel closed by the other process while waiting for {expected}")]
    Closed { expected: &'static str },
    #[error("hand-off channel: timed out after {after:?} waiting for {expected}")]
    Timeout {
        after: Duration,
        expected: &'static str,
    },
    #[error("hand-off channel: expected {expected}, got {got}")]
    Unexpected { expected: &'static str, got: String },
    #[error("hand-off channel: bad frame: {0}")]
    BadFrame(String),
    #[error("the other process refused: {0}")]
    Refused(String),
    #[error("hand-off channel: {sent} sockets announced but {received} descriptors received")]
    FdCount { sent: usize, received: usize },
    #[error("limiter state in the hand-off: {0}")]
    State(#[from] SnapshotError),
}

/// One listening socket in a [`Message::Sockets`] announcement; the
/// descriptors follow in the same order.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SocketMeta {
    /// `None` for the upgrade socket itself.
    pub role: Option<SocketRole>,
    /// The configured address (`ip:port`, port 0 kept), or the upgrade
    /// socket's path.
    pub configured: String,
    /// Where it is bound, for logs.
    pub local: String,
}

/// A JSON message on the channel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Message {
    /// new → old: I am the child you started; hand me your sockets.
    Take { pid: u32 },
    /// operator → old: upgrade now and tell me how it ended.
    Upgrade,
    /// old → operator.
    UpgradeResult {
        ok: bool,
        new_pid: Option<u32>,
        message: String,
    },
    /// old → new: the listening sockets; descriptors ride on this frame.
    /// Also the pools' learned admission limits (absent from a process
    /// older than them: then the new one starts as from cold).
    Sockets {
        generation: u64,
        sockets: Vec<SocketMeta>,
        #[serde(default)]
        admission: Vec<PoolLimit>,
    },
    /// new → old: accepting on every socket.
    Ready {
        pid: u32,
        listeners: usize,
        keys: usize,
    },
    /// old → new: stopped accepting; the new process owns the sockets now.
    Committed,
    /// Either way: no.
    Refused { reason: String },
}

impl Message {
    fn name(&self) -> &'static str {
        match self {
            Message::Take { .. } => "take",
            Message::Upgrade => "upgrade",
            Message::UpgradeResult { .. } => "upgrade_result",
            Message::Sockets { .. } => "sockets",
            Message::Ready { .. } => "ready",
            Message::Committed => "committed",
            Message::Refused { .. } => "refused",
        }
    }
}

/// A received frame.
#[derive(Debug)]
pub enum Frame {
    Message(Message),
    Blob(Vec<u8>),
}

const KIND_MESSAGE: u8 = b'J';
const KIND_BLOB: u8 = b'B';

/// One end of a hand-off connection.
#[derive(Debug)]
pub struct Channel {
    stream: UnixStream,
    /// Bytes received but not yet framed.
    buffer: Vec<u8>,
    /// Descriptors received and not yet claimed by a `Sockets` frame.
    fds: Vec<OwnedFd>,
}

impl Channel {
    pub fn new(stream: UnixStream) -> Channel {
        Channel {
            stream,
            buffer: Vec::new(),
            fds: Vec::new(),
        }
    }

    /// Connects to an upgrade socket.
    pub async fn connect(path: &Path) -> Result<Channel, HandoffError> {
        UnixStream::connect(path)
            .await
            .map(Channel::new)
            .map_err(|source| HandoffError::Connect {
                path: path.display().to_string(),
                source,
            })
    }

    /// The peer process's pid, from the kernel (`SO_PEERCRED`), not from
    /// anything the peer said.
    pub fn peer_pid(&self) -> Option<u32> {
        self.stream
            .peer_cred()
            .ok()
            .and_then(|c| c.pid())
            .and_then(|p| u32::try_from(p).ok())
    }

    /// The peer's user id.
    pub fn peer_uid(&self) -> Option<u32> {
        self.stream.peer_cred().ok().map(|c| c.uid())
    }

    pub async fn send(&self, message: &Message) -> Result<(), HandoffError> {
        self.send_with_fds(message, &[]).await
    }

    /// Sends `message` with `fds` attached to its first byte.
    pub async fn send_with_fds(
        &self,
        message: &Message,
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), HandoffError> {
        let json = serde_json::to_vec(message).map_err(|e| {
            HandoffError::BadFrame(format!("cannot encode {}: {e}", message.name()))
        })?;
        self.send_frame(KIND_MESSAGE, &json, fds).await
    }

    pub async fn send_blob(&self, bytes: &[u8]) -> Result<(), HandoffError> {
        self.send_frame(KIND_BLOB, bytes, &[]).await
    }

    async fn send_frame(
        &self,
        kind: u8,
        payload: &[u8],
        fds: &[BorrowedFd<'_>],
    ) -> Result<(), HandoffError> {
        if payload.len() > MAX_FRAME || fds.len() > MAX_FDS {
            return Err(HandoffError::BadFrame(format!(
                "frame of {} bytes and {} descriptors is too large",
                payload.len(),
                fds.len()
            )));
        }
        let len = u32::try_from(payload.len() + 1).unwrap_or(u32::MAX);
        let mut frame = Vec::with_capacity(payload.len() + 5);
        frame.extend_from_slice(&len.to_le_bytes());
        frame.push(kind);
        frame.extend_from_slice(payload);
        let mut sent = 0;
        let mut fds_pending = !fds.is_empty();
        while sent < frame.len() {
            let n = self
                .stream
                .async_io(Interest::WRITABLE, || {
                    let mut space =
                        [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
                    let mut control = SendAncillaryBuffer::new(&mut space);
                    if fds_pending && !control.push(SendAncillaryMessage::ScmRights(fds)) {
                        return Err(io::Error::other(
                            "descriptors do not fit the control buffer",
                        ));
                    }
                    rustix::net::sendmsg(
                        &self.stream,
                        &[IoSlice::new(&frame[sent..])],
                        &mut control,
                        SendFlags::NOSIGNAL,
                    )
                    .map_err(io::Error::from)
                })
                .await
                .map_err(|source| HandoffError::Io {
                    action: "send",
                    source,
                })?;
            if n == 0 {
                return Err(HandoffError::Closed {
                    expected: "a reader",
                });
            }
            // The descriptors went with the first byte sent.
            fds_pending = false;
            sent += n;
        }
        Ok(())
    }

    /// Receives the next frame; `None` when the peer closed cleanly between
    /// frames.
    pub async fn recv(&mut self) -> Result<Option<Frame>, HandoffError> {
        loop {
            if let Some(frame) = self.pop_frame()? {
                return Ok(Some(frame));
            }
            let mut chunk = vec![0u8; 64 * 1024];
            let fds = &mut self.fds;
            let stream = &self.stream;
            let n = stream
                .async_io(Interest::READABLE, || {
                    let mut space =
                        [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
                    let mut control = RecvAncillaryBuffer::new(&mut space);
                    let got = rustix::net::recvmsg(
                        stream,
                        &mut [IoSliceMut::new(&mut chunk)],
                        &mut control,
                        RecvFlags::CMSG_CLOEXEC,
                    )
                    .map_err(io::Error::from)?;
                    for message in control.drain() {
                        if let RecvAncillaryMessage::ScmRights(received) = message {
                            fds.extend(received);
                        }
                    }
                    if got.flags.contains(ReturnFlags::CTRUNC) {
                        return Err(io::Error::other(
                            "descriptors were dropped: control buffer too small",
                        ));
                    }
                    Ok(got.bytes)
                })
                .await
                .map_err(|source| HandoffError::Io {
                    action: "receive",
                    source,
                })?;
            if n == 0 {
                if self.buffer.is_empty() {
                    return Ok(None);
                }
                return Err(HandoffError::BadFrame(format!(
                    "connection closed inside a frame ({} bytes buffered)",
                    self.buffer.len()
                )));
            }
            self.buffer.extend_from_slice(&chunk[..n]);
        }
    }

    fn pop_frame(&mut self) -> Result<Option<Frame>, HandoffError> {
        let Some(head) = self.buffer.get(..4) else {
            return Ok(None);
        };
        let len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
        if len == 0 || len > MAX_FRAME + 1 {
            return Err(HandoffError::BadFrame(format!("frame length {len}")));
        }
        if self.buffer.len() < 4 + len {
            return Ok(None);
        }
        let frame: Vec<u8> = self.buffer.drain(..4 + len).skip(4).collect();
        match frame[0] {
            KIND_MESSAGE => serde_json::from_slice(&frame[1..])
                .map(|m| Some(Frame::Message(m)))
                .map_err(|e| HandoffError::BadFrame(format!("message does not parse: {e}"))),
            KIND_BLOB => Ok(Some(Frame::Blob(frame[1..].to_vec()))),
            other => Err(HandoffError::BadFrame(format!(
                "unknown frame kind {other:#04x}"
            ))),
        }
    }

    /// Receives a message, failing on a blob, a close or `timeout`.
    pub async fn recv_message(
        &mut self,
        expected: &'static str,
        timeout: Duration,
    ) -> Result<Message, HandoffError> {
        match tokio::time::timeout(timeout, self.recv()).await {
            Err(_) => Err(HandoffError::Timeout {
                after: timeout,
                expected,
            }),
            Ok(Err(e)) => Err(e),
            Ok(Ok(None)) => Err(HandoffError::Closed { expected }),
            Ok(Ok(Some(Frame::Blob(b)))) => Err(HandoffError::Unexpected {
                expected,
                got: format!("a blob of {} bytes", b.len()),
            }),
            Ok(Ok(Some(Frame::Message(Message::Refused { reason })))) => {
                Err(HandoffError::Refused(reason))
            }
            Ok(Ok(Some(Frame::Message(m)))) => Ok(m),
        }
    }

    /// Receives a blob, failing on a message, a close or `timeout`.
    pub async fn recv_blob(
        &mut self,
        expected: &'static str,
        timeout: Duration,
    ) -> Result<Vec<u8>, HandoffError> {
        match tokio::time::timeout(timeout, self.recv()).await {
            Err(_) => Err(HandoffError::Timeout {
                after: timeout,
                expected,
            }),
            Ok(Err(e)) => Err(e),
            Ok(Ok(None)) => Err(HandoffError::Closed { expected }),
            Ok(Ok(Some(Frame::Blob(b)))) => Ok(b),
            Ok(Ok(Some(Frame::Message(m)))) => Err(HandoffError::Unexpected {
                expected,
                got: m.name().to_owned(),
            }),
        }
    }

    /// Takes every descriptor received so far.
    pub fn take_fds(&mut self) -> Vec<OwnedFd> {
        std::mem::take(&mut self.fds)
    }
}

impl AsFd for Channel {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.stream.as_fd()
    }
}

/// Encodes a snapshot exactly as the snapshot file is written (through a
/// private temporary file, so both sides run `write_to`/`read_from`).
pub fn snapshot_to_bytes(snapshot: &Snapshot) -> Result<Vec<u8>, SnapshotError> {
    let dir = tempfile::tempdir().map_err(|source| SnapshotError::Io {
        path: std::env::temp_dir(),
        action: "create a temporary directory for",
        source,
    })?;
    let path = dir.path().join("handoff.snap");
    snapshot.write_to(&path)?;
    std::fs::read(&path).map_err(|source| SnapshotError::Io {
        path,
        action: "read back",
        source,
    })
}

/// Decodes bytes made by [`snapshot_to_bytes`] (checksum and all).
pub fn snapshot_from_bytes(bytes: &[u8]) -> Result<Snapshot, SnapshotError> {
    let dir = tempfile::tempdir().map_err(|source| SnapshotError::Io {
        path: std::env::temp_dir(),
        action: "create a temporary directory for",
        source,
    })?;
    let path = dir.path().join("handoff.snap");
    std::fs::write(&path, bytes).map_err(|source| SnapshotError::Io {
        path: path.clone(),
        action: "write",
        source,
    })?;
    Snapshot::read_from(&path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::os::fd::AsFd;

    #[tokio::test]
    async fn messages_blobs_and_listening_sockets_cross_the_channel() {
        let (a, b) = UnixStream::pair().unwrap();
        let (old, mut new) = (Channel::new(a), Channel::new(b));
        let l1 = TcpListener::bind("127.0.0.1:0").unwrap();
        let l2 = TcpListener::bind("127.0.0.1:0").unwrap();
        let sockets = Message::Sockets {
            generation: 7,
            sockets: vec![],
            admission: vec![PoolLimit {
                pool: "app".into(),
                state: crate::admission::LimitState {
                    limit: 12.5,
                    long_rtt_secs: Some(0.04),
                    probing: false,
                    calm_peak: Some(9.0),
                },
                shapes: None,
            }],
        };
        old.send_with_fds(&sockets, &[l1.as_fd(), l2.as_fd()])
            .await
            .unwrap();
        old.send_blob(&vec![9u8; 200_000]).await.unwrap();
        old.send(&Message::Committed).await.unwrap();
        drop(old);

        let t = Duration::from_secs(5);
        assert_eq!(new.recv_message("sockets", t).await.unwrap(), sockets);
        let fds = new.take_fds();
        assert_eq!(fds.len(), 2);
        // The received descriptors are the same sockets: same bound address.
        let got = TcpListener::from(fds.into_iter().next().unwrap());
        assert_eq!(got.local_addr().unwrap(), l1.local_addr().unwrap());
        assert_eq!(new.recv_blob("state", t).await.unwrap(), vec![9u8; 200_000]);
        assert_eq!(
            new.recv_message("committed", t).await.unwrap(),
            Message::Committed
        );
        assert!(matches!(
            new.recv_message("more", t).await,
            Err(HandoffError::Closed { .. })
        ));
    }

    #[tokio::test]
    async fn refusals_and_wrong_frames_are_errors_naming_what_was_expected() {
        let (a, b) = UnixStream::pair().unwrap();
        let (old, mut new) = (Channel::new(a), Channel::new(b));
        let t = Duration::from_secs(5);
        old.send(&Message::Refused {
            reason: "not my child".into(),
        })
        .await
        .unwrap();
        old.send_blob(b"x").await.unwrap();
        old.send(&Message::Committed).await.unwrap();
        let cases: Vec<Result<(), HandoffError>> = vec![
            new.recv_message("sockets", t).await.map(drop),
            new.recv_message("ready", t).await.map(drop),
            new.recv_blob("state", t).await.map(drop),
            new.recv_message("ready", Duration::from_millis(20))
                .await
                .map(drop),
        ];
        let texts: Vec<String> = cases
            .into_iter()
            .map(|r| r.unwrap_err().to_string())
            .collect();
        let want = [
            "refused: not my child",
            "expected ready, got a blob of 1 bytes",
            "expected state, got committed",
            "timed out after 20ms waiting for ready",
        ];
        for (text, want) in texts.iter().zip(want) {
            assert!(text.contains(want), "{text} / {want}");
        }
    }

    #[test]
    fn bad_frames_are_refused() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let _g = rt.enter();
        let mut ch = Channel::new(UnixStream::from_std(a).unwrap());
        // (bytes, error contains)
        let cases: [(&[u8], &str); 3] = [
            (&[0, 0, 0, 0], "frame length 0"),
            (&[2, 0, 0, 0, b'Q', 0], "unknown frame kind 0x51"),
            (&[3, 0, 0, 0, b'J', b'{', b'}'], "message does not parse"),
        ];
        for (bytes, want) in cases {
            ch.buffer = bytes.to_vec();
            let err = ch.pop_frame().unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
        }
    }
}
