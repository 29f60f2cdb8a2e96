//! A real `redis-server` for tests: started on a free loopback port in a
//! temporary directory, with persistence off, killed and reaped on drop.
//!
//! It does not skip anything when `redis-server` is missing: the start
//! panics with a message saying what to install, because a test that
//! silently passes without its server proves nothing (CI installs it).
//! Set `WEIR_REDIS_SERVER` to use a binary that is not on `PATH`.

use std::io::{ErrorKind, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a started server may take to answer `PING`.
const READY_WITHIN: Duration = Duration::from_secs(10);

pub(crate) struct RedisServer {
    child: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Starts a server on a free port of 127.0.0.1 and waits until it answers.
    pub(crate) fn start() -> RedisServer {
        RedisServer::start_on(free_port())
    }

    /// Starts a server on `port` of 127.0.0.1 (for a limiter that was told
    /// the address before anything listened there).
    pub(crate) fn start_on(port: u16) -> RedisServer {
        let dir = tempfile::tempdir().expect("temporary directory for redis-server");
        let mut server = RedisServer {
            child: None,
            port,
            dir,
        };
        server.restart();
        server
    }

    pub(crate) fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// SIGKILLs the server (no clean shutdown, as in a crash) and reaps it.
    pub(crate) fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// SIGSTOPs the server: connections stay open and nothing answers, as
    /// with a Redis stuck on a slow command or a starved host.
    pub(crate) fn pause(&self) {
        self.signal("-STOP");
    }

    /// SIGCONTs a paused server.
    pub(crate) fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("redis-server is running");
        let status = Command::new("kill")
            .args([signal, &child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} failed: {status}");
    }

    /// Starts the server again on the same port (after [`Self::kill`]); it
    /// comes back empty, as a Redis without persistence does.
    pub(crate) fn restart(&mut self) {
        self.kill();
        let binary =
            std::env::var("WEIR_REDIS_SERVER").unwrap_or_else(|_| "redis-server".to_owned());
        let child = Command::new(&binary)
            .args(["--save", "", "--appendonly", "no", "--bind", "127.0.0.1"])
            .args(["--port", &self.port.to_string()])
            .current_dir(self.dir.path())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match child {
            Ok(child) => child,
            Err(e) if e.kind() == ErrorKind::NotFound => panic!(
                "`{binary}` not found: these tests need a real Redis \
                 (apt-get install redis-server, or set WEIR_REDIS_SERVER to its path)"
            ),
            Err(e) => panic!("cannot start `{binary}`: {e}"),
        };
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_WITHIN;
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, self.port));
        loop {
            if ping(addr) {
                return;
            }
            if let Some(child) = self.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                panic!(
                    "redis-server on port {} exited at start-up: {status}",
                    self.port
                );
            }
            assert!(
                Instant::now() < deadline,
                "redis-server on port {} did not answer PING within {READY_WITHIN:?}",
                self.port
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A port that was free a moment ago (the race with other binders is
/// harmless here: the server then fails to start and the test says so).
pub(crate) fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local address").port()
}

fn ping(addr: SocketAddr) -> bool {
    let Ok(mut stream) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = stream.set_read_timeout(Some(Duration::from_millis(500)));
    if stream.write_all(b"PING\r\n").is_err() {
        return false;
    }
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply).is_ok() && &reply == b"+PONG\r\n"
}
