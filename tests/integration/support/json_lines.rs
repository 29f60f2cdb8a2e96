//! Logs written as JSON lines by another task or process (weir's access
//! log, a replayed log), read once the lines a test expects are there.
//!
//! Owns: waiting for a line count, parsing each line.
//!
//! Does not: follow a rotated file, or accept a line that is not JSON (a test
//! reading one has found a bug).

use std::path::Path;

/// The JSON lines of `path`, once at least `n` are written; panics, naming
/// the file, if they are not within the `eventually` deadline.
pub async fn json_lines(path: &Path, n: usize) -> Vec<serde_json::Value> {
    let mut text: String;
    assert_eventually_async!(
        {
            text = std::fs::read_to_string(path).unwrap_or_default();
            text.lines().count() >= n
        },
        "fewer than {n} lines in {}:\n{text}",
        path.display()
    );
    (text.lines())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}
