//! Dominant peer detection (stub).
