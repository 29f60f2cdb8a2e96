//! A real HAProxy as a rival gateway in front of the app, configured by a scenario
//! variant (`gateway = "haproxy"`), to measure weir against.
//!
//! The lab writes the `global` section (its pid file, one thread, `maxconn` with `no
//! strict-limits`: the machine's 20,000 descriptors cannot be raised) and the variant
//! writes everything after it (`defaults`, frontends, backends, stick tables), with
//! `{{app}}`, `{{dir}}` and `{{listen}}` filled in. It runs `/usr/sbin/haproxy` (or
//! `$WEIR_LAB_HAPROXY`) in the foreground (`-db`) from its own temp dir (see
//! [`crate::process`]) and stops it by its process id. It does not install or tune
//! HAProxy.

use std::net::SocketAddr;

use super::process::{ProcessError, Program, ServerDir, ServerProcess};

/// HAProxy: `/usr/sbin/haproxy` unless `WEIR_LAB_HAPROXY` names another binary.
pub const HAPROXY: Program = Program {
    name: "haproxy",
    binary: "/usr/sbin/haproxy",
    env: "WEIR_LAB_HAPROXY",
    package: "haproxy",
};

/// Starts HAProxy as a rival gateway from a variant's `config`.
pub fn start_gateway(config: &str, app: SocketAddr) -> Result<ServerProcess, ProcessError> {
    let dir = ServerDir::new(HAPROXY, "a variant with gateway = \"haproxy\"")?;
    let body = dir.fill(config, app);
    let cfg = dir.write("haproxy.cfg", &main_config(&dir, &body))?;
    ServerProcess::start(dir, &["-db".as_ref(), "-f".as_ref(), cfg.as_os_str()])
}

/// The whole config: the lab's `global` section, then the variant's text.
fn main_config(dir: &ServerDir, body: &str) -> String {
    format!(
        "global\n    pidfile {pid}\n    nbthread 1\n    maxconn 10000\n    no strict-limits\n\n{body}\n",
        pid = dir.path("haproxy.pid").display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rival_config_follows_the_labs_global_section() {
        let dir = ServerDir {
            program: HAPROXY,
            dir: tempfile::tempdir().expect("dir"),
            listen: "127.0.0.1:4321".parse().expect("literal"),
        };
        let app: SocketAddr = "127.0.0.1:8081".parse().expect("literal");
        let body = dir.fill(
            "frontend f\n    bind {{listen}}\n    default_backend b\nbackend b\n    server app {{app}} maxconn 9\n",
            app,
        );
        let cfg = main_config(&dir, &body);
        assert!(cfg.starts_with("global\n"), "{cfg}");
        assert!(cfg.contains("bind 127.0.0.1:4321\n"), "{cfg}");
        assert!(cfg.contains("server app 127.0.0.1:8081 maxconn 9"), "{cfg}");
        assert!(cfg.contains("no strict-limits"), "{cfg}");
    }
}
