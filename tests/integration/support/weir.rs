//! A weir process guard: spawns `weir run -c <file> --ready-file <file>` from a
//! TOML config in a fresh temp dir and waits for the ready file.
//!
//! Contract with `weir run` (see the `run` command): once every listener and
//! the admin endpoint are bound, weir writes the ready file as JSON
//! `{"listeners":["127.0.0.1:PORT",...],"admin":"127.0.0.1:PORT","pid":N}`.
//! Configs bind port 0, so the ready file is the only source of addresses.
//! stdout (the access log) and stderr are captured to files in the temp dir.
//!
//! Owns: writing the config, polling the ready file with a deadline (a file
//! that does not parse yet is a partial write, polled again), signals, exit.
//!
//! Does not: parse weir's config or logs; tests assert on those themselves.
//!
//! ```ignore
//! let weir = Weir::builder().config(format!(r#"
//!     [[listeners]]
//!     address = "127.0.0.1:0"
//!     [pools.app]
//!     servers = ["{upstream}"]
//!     [[routes]]
//!     pool = "app"
//!     class = "page"
//! "#)).start().await?;
//! let resp = HttpRequest::get("/").send(weir.listener(0)).await?;
//! weir.signal(Signal::Term)?;
//! assert!(weir.wait_exit(Duration::from_secs(5)).await?.success());
//! ```

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::client::HttpRequest;
use super::process::{
    FixtureError, POLL, START_DEADLINE, ServerProcess, Signal, send_signal, temp_dir, write_file,
};

/// What `weir run --ready-file` writes once it is bound.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
pub struct ReadyFile {
    pub listeners: Vec<SocketAddr>,
    pub admin: SocketAddr,
    pub pid: u32,
}

/// Builds a [`Weir`].
pub struct WeirBuilder {
    program: PathBuf,
    config: String,
    extra_args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    ready_deadline: Duration,
}

impl WeirBuilder {
    /// The TOML config, written to `<dir>/weir.toml`.
    pub fn config(mut self, toml: impl Into<String>) -> Self {
        self.config = toml.into();
        self
    }

    /// Runs another executable with the same arguments (fixture self-tests,
    /// or a release build for load tests).
    pub fn program(mut self, path: impl Into<PathBuf>) -> Self {
        self.program = path.into();
        self
    }

    /// An argument after `run -c FILE --ready-file FILE`.
    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.extra_args.push(arg.into());
        self
    }

    /// An environment variable for weir (e.g. for `${VAR}` substitution).
    pub fn env(mut self, key: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// How long to wait for the ready file (default 15 s).
    pub fn ready_deadline(mut self, deadline: Duration) -> Self {
        self.ready_deadline = deadline;
        self
    }

    pub async fn start(self) -> Result<Weir, FixtureError> {
        let dir = temp_dir("weir")?;
        let config_path = dir.path().join("weir.toml");
        let ready_path = dir.path().join("ready.json");
        write_file("weir", &config_path, &self.config)?;
        let mut command = Command::new(&self.program);
        command
            .arg("run")
            .arg("-c")
            .arg(&config_path)
            .arg("--ready-file")
            .arg(&ready_path)
            .args(&self.extra_args)
            .envs(self.env.iter().map(|(k, v)| (k, v)));
        let mut process = ServerProcess::spawn("weir", command, dir.path(), Vec::new())?;
        let ready = wait_ready(&mut process, &ready_path, self.ready_deadline).await?;
        Ok(Weir {
            process,
            ready,
            config_path,
            ready_path,
            dir,
        })
    }
}

async fn wait_ready(
    process: &mut ServerProcess,
    path: &Path,
    deadline: Duration,
) -> Result<ReadyFile, FixtureError> {
    let start = Instant::now();
    let mut last_problem = "no ready file yet".to_owned();
    loop {
        process.check_running()?;
        match std::fs::read_to_string(path) {
            Ok(text) => match serde_json::from_str::<ReadyFile>(&text) {
                Ok(ready) => return Ok(ready),
                Err(e) => last_problem = format!("ready file {text:?} does not parse: {e}"),
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => last_problem = format!("cannot read ready file: {e}"),
        }
        if start.elapsed() >= deadline {
            return Err(FixtureError::NotReady {
                server: "weir".to_owned(),
                waited: deadline,
                what: format!("{}: {last_problem}", path.display()),
                logs: process.logs(),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// A running weir; TERM, grace, KILL and reaped on drop.
pub struct Weir {
    process: ServerProcess,
    ready: ReadyFile,
    config_path: PathBuf,
    ready_path: PathBuf,
    // Last: the dir must outlive the process.
    dir: tempfile::TempDir,
}

impl Weir {
    pub fn builder() -> WeirBuilder {
        WeirBuilder {
            program: PathBuf::from(env!("CARGO_BIN_EXE_weir")),
            config: String::new(),
            extra_args: Vec::new(),
            env: Vec::new(),
            ready_deadline: START_DEADLINE,
        }
    }

    /// The `i`th listener's bound address, in config order (panics if out of
    /// range: a bug in the test).
    pub fn listener(&self, i: usize) -> SocketAddr {
        self.ready.listeners[i]
    }

    pub fn listeners(&self) -> &[SocketAddr] {
        &self.ready.listeners
    }

    pub fn admin(&self) -> SocketAddr {
        self.ready.admin
    }

    /// The admin endpoint's `/metrics` text (panics if it does not answer).
    pub async fn metrics(&self) -> String {
        HttpRequest::get("/metrics")
            .send(self.admin())
            .await
            .expect("metrics")
            .text()
    }

    /// The admin endpoint's `/status` document (panics if it does not answer
    /// with JSON).
    pub async fn status(&self) -> serde_json::Value {
        let r = HttpRequest::get("/status")
            .send(self.admin())
            .await
            .expect("status");
        serde_json::from_str(&r.text()).expect("status is JSON")
    }

    /// The pid weir reported in its ready file.
    pub fn pid(&self) -> u32 {
        self.ready.pid
    }

    /// The pid of the process this fixture spawned (equal to [`Weir::pid`]
    /// unless weir handed off to another process).
    pub fn child_pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn ready(&self) -> &ReadyFile {
        &self.ready
    }

    /// Sends `signal` to the pid in the ready file (SIGHUP reloads, SIGTERM
    /// drains).
    pub fn signal(&self, signal: Signal) -> Result<(), FixtureError> {
        send_signal("weir", self.ready.pid, signal)
    }

    /// Waits until the spawned process exits, or fails after `deadline`.
    pub async fn wait_exit(&mut self, deadline: Duration) -> Result<ExitStatus, FixtureError> {
        self.process.wait_exit(deadline).await
    }

    /// Replaces the config file (follow with `signal(Signal::Hup)` to reload).
    pub fn write_config(&self, toml: &str) -> Result<(), FixtureError> {
        write_file("weir", &self.config_path, toml)
    }

    /// Re-reads the ready file (after a reload or upgrade rewrote it).
    pub fn reread_ready(&mut self) -> Result<&ReadyFile, FixtureError> {
        let text =
            std::fs::read_to_string(&self.ready_path).map_err(|source| FixtureError::Setup {
                server: "weir".to_owned(),
                what: format!("read {}", self.ready_path.display()),
                source,
            })?;
        self.ready = serde_json::from_str(&text).map_err(|e| FixtureError::NotReady {
            server: "weir".to_owned(),
            waited: Duration::ZERO,
            what: format!("ready file {text:?} does not parse: {e}"),
            logs: self.process.logs(),
        })?;
        Ok(&self.ready)
    }

    /// Captured stdout so far (the access log).
    pub fn stdout(&self) -> String {
        self.process.stdout()
    }

    pub fn stderr(&self) -> String {
        self.process.stderr()
    }

    pub fn stdout_path(&self) -> &Path {
        self.process.stdout_path()
    }

    pub fn stderr_path(&self) -> &Path {
        self.process.stderr_path()
    }

    pub fn config_path(&self) -> &Path {
        &self.config_path
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}
