//! Listening sockets a starting instance takes over instead of binding, and
//! the sockets a running instance keeps so it can hand them on.
//!
//! Two sources hand sockets to weir: the previous weir process during an
//! in-place upgrade (each socket tagged with its role and the address it was
//! configured with, so `127.0.0.1:0` finds its socket again) and systemd
//! socket activation (untagged; matched by the address it is bound to).
//!
//! This module only matches sockets to configured addresses; binding fresh
//! sockets is `edge::listener`, moving them between processes is `handoff`.

use std::net::{SocketAddr, TcpListener};

use serde::{Deserialize, Serialize};

use weir_limiter::Snapshot;

/// What a listening socket is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SocketRole {
    /// A `[[listeners]]` entry: client traffic.
    Client,
    /// The `[admin]` listener.
    Admin,
}

/// A listening socket received from outside the process.
#[derive(Debug)]
pub struct InheritedListener {
    /// Role and configured address, when the giver knew them (an upgrade);
    /// `None` for systemd sockets, matched by bound address instead.
    pub tag: Option<(SocketRole, SocketAddr)>,
    pub listener: TcpListener,
}

impl InheritedListener {
    /// True when this socket serves `role` at configured address `want`.
    fn serves(&self, role: SocketRole, want: SocketAddr) -> bool {
        match self.tag {
            Some((r, configured)) => r == role && configured == want,
            // An activated socket has a real port; port 0 in the config
            // means "any", so only the IP must agree then.
            None => self
                .listener
                .local_addr()
                .is_ok_and(|local| local == want || (want.port() == 0 && local.ip() == want.ip())),
        }
    }
}

/// Everything a starting instance takes over: listening sockets and limiter
/// state. `Default` is a cold start (bind everything, restore from the file).
#[derive(Debug, Default)]
pub struct Inherited {
    pub listeners: Vec<InheritedListener>,
    /// Limiter state from the previous process; replaces the file restore.
    pub snapshot: Option<Snapshot>,
    /// The previous process's generation id, for logs.
    pub from_generation: Option<u64>,
    /// The pools' admission limits as the previous process had learned
    /// them; a pool not named starts as from cold.
    pub admission: Vec<crate::admission::PoolLimit>,
    /// In an upgrade: when this process must have reported ready, with a
    /// margin before the previous process gives up on it. The warm-up
    /// (`warmup`) ends by then at the latest.
    pub ready_by: Option<std::time::Instant>,
}

impl Inherited {
    /// Removes and returns the first socket serving `role` at `want`.
    pub fn take(&mut self, role: SocketRole, want: SocketAddr) -> Option<InheritedListener> {
        let i = self.listeners.iter().position(|l| l.serves(role, want))?;
        Some(self.listeners.swap_remove(i))
    }
}

/// A socket a running instance listens on, kept (as a duplicate descriptor
/// of the same socket) so it can be handed to the next process.
#[derive(Debug)]
pub struct ListeningSocket {
    pub role: SocketRole,
    /// The address as configured (port 0 stays 0).
    pub configured: SocketAddr,
    pub socket: TcpListener,
    /// systemd keeps this socket open (socket activation) and queues on it
    /// for the next process: weir's exit does not close it.
    pub held_by_systemd: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bound() -> TcpListener {
        TcpListener::bind("127.0.0.1:0").unwrap()
    }

    #[test]
    fn sockets_match_by_role_and_configured_or_bound_address() {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let activated = bound();
        let port = activated.local_addr().unwrap();
        let mut inherited = Inherited {
            listeners: vec![
                InheritedListener {
                    tag: Some((SocketRole::Admin, any)),
                    listener: bound(),
                },
                InheritedListener {
                    tag: Some((SocketRole::Client, any)),
                    listener: bound(),
                },
                InheritedListener {
                    tag: None,
                    listener: activated,
                },
            ],
            ..Inherited::default()
        };
        // (role, wanted address, found)
        let cases = [
            (SocketRole::Client, "127.0.0.2:0", false),
            (SocketRole::Client, "127.0.0.1:0", true), // the tagged client socket
            (SocketRole::Client, &*port.to_string(), true), // the activated one, by port
            (SocketRole::Client, "127.0.0.1:0", false), // both client sockets taken
            (SocketRole::Admin, "127.0.0.1:0", true),
            (SocketRole::Admin, "127.0.0.1:0", false),
        ];
        for (role, want, found) in cases {
            let got = inherited.take(role, want.parse().unwrap());
            assert_eq!(got.is_some(), found, "{role:?} {want}");
        }
    }
}
