//! upstream (being written).
