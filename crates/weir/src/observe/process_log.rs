//! The format of weir's own log on stderr (`[log] format`): text for a
//! terminal, JSON for a log pipeline. The binary installs both formatters
//! and asks [`json`] per event, so a configuration (or a reload) can switch
//! the format after logging began: errors before the configuration is read
//! still reach stderr. `WEIR_LOG_FORMAT=json` sets it before that.
//!
//! This module does not own what is logged, nor the filter (`WEIR_LOG`).

use std::sync::atomic::{AtomicBool, Ordering};

use serde::Deserialize;

/// How weir's own log is written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// `2026-12-02T04:00:00Z  INFO weir: message key=value`.
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `fields`
    /// (the message and every key), `span`s.
    Json,
}

static JSON: AtomicBool = AtomicBool::new(false);

/// Switches the format for every event from now on.
pub fn set(format: Format) {
    JSON.store(format == Format::Json, Ordering::Relaxed);
}

/// Whether events are written as JSON now.
pub fn json() -> bool {
    JSON.load(Ordering::Relaxed)
}

/// The format `WEIR_LOG_FORMAT` names, if it names one.
pub fn from_env() -> Option<Format> {
    match std::env::var("WEIR_LOG_FORMAT").ok()?.as_str() {
        "json" => Some(Format::Json),
        "text" => Some(Format::Text),
        _ => None,
    }
}

/// Applies the configuration's format, unless `WEIR_LOG_FORMAT` chose one.
pub fn configure(format: Format) {
    set(from_env().unwrap_or(format));
}
