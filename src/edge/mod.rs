//! edge (being written).

pub mod proxy_protocol;
