//! Forwarding headers (stub).
