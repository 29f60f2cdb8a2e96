//! A Redis process guard: one `redis-server` on a loopback port with no
//! persistence, in a fresh temp dir.
//!
//! Owns: the config (bind 127.0.0.1, own port, pid file and dir, `save ""`,
//! no AOF, log to stdout) plus any extra lines a test adds, and waiting for
//! the port.
//!
//! Does not: speak RESP; tests use raw RESP over a TcpStream or weir's client.
//!
//! ```ignore
//! let redis = Redis::builder().start().await?;
//! let mut s = TcpStream::connect(redis.addr()).await?;
//! s.write_all(b"*1\r\n$4\r\nPING\r\n").await?; // reads "+PONG\r\n"
//! ```

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;

use super::ports::{PORT_ATTEMPTS, find_program, free_addrs, is_port_taken};
use super::process::{FixtureError, START_DEADLINE, ServerProcess, Signal, temp_dir, write_file};

/// Builds a [`Redis`].
pub struct RedisBuilder {
    extra: String,
    addr: Option<SocketAddr>,
}

impl RedisBuilder {
    /// Extra `redis.conf` lines (e.g. `maxmemory 10mb`).
    pub fn config(mut self, lines: impl Into<String>) -> Self {
        self.extra = lines.into();
        self
    }

    /// Listen on this address (to restart a killed Redis where clients expect it).
    pub fn addr(mut self, addr: SocketAddr) -> Self {
        self.addr = Some(addr);
        self
    }

    pub async fn start(self) -> Result<Redis, FixtureError> {
        let program = find_program("redis-server")?;
        let mut attempt = 0;
        loop {
            attempt += 1;
            let dir = temp_dir("redis")?;
            let addrs = match self.addr {
                Some(a) => vec![a],
                None => free_addrs("redis", 1)?,
            };
            let addr = addrs[0];
            let conf = dir.path().join("redis.conf");
            write_file("redis", &conf, &self.render(dir.path(), addr))?;
            let mut command = Command::new(&program);
            command.arg(&conf);
            let mut process = ServerProcess::spawn("redis", command, dir.path(), Vec::new())?;
            match process.wait_accepting(&addrs, START_DEADLINE).await {
                Ok(()) => return Ok(Redis { process, addr, dir }),
                Err(e) if attempt < PORT_ATTEMPTS && is_port_taken(&e) => continue,
                Err(e) => return Err(e),
            }
        }
    }

    fn render(&self, dir: &Path, addr: SocketAddr) -> String {
        format!(
            "bind 127.0.0.1\n\
             port {port}\n\
             dir {d}\n\
             pidfile {d}/redis.pid\n\
             logfile \"\"\n\
             daemonize no\n\
             save \"\"\n\
             appendonly no\n\
             {extra}\n",
            port = addr.port(),
            d = dir.display(),
            extra = self.extra,
        )
    }
}

/// A running Redis; stopped and reaped on drop.
pub struct Redis {
    process: ServerProcess,
    addr: SocketAddr,
    // Last: the dir must outlive the process.
    dir: tempfile::TempDir,
}

impl Redis {
    pub fn builder() -> RedisBuilder {
        RedisBuilder {
            extra: String::new(),
            addr: None,
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn logs(&self) -> String {
        self.process.logs()
    }

    pub fn signal(&self, signal: Signal) -> Result<(), FixtureError> {
        self.process.signal(signal)
    }
}
