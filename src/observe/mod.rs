//! observe (being written).
