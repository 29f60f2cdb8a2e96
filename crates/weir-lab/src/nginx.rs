//! A real nginx as the load balancer in front of weir (incident 4: a limit tested only by
//! calling the service directly saw every request as the load balancer's address once
//! deployed behind one).
//!
//! The lab starts `/usr/sbin/nginx` (or `$WEIR_LAB_NGINX`) in the foreground with its own
//! temp dir for config, pid file, error log and temp paths, proxying to weir with
//! `X-Forwarded-For: $proxy_add_x_forwarded_for` over keep-alive upstream connections, and
//! stops it by its process id when dropped. It does not install nginx, tune it, or speak
//! TLS.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Where nginx is looked for unless `WEIR_LAB_NGINX` names another binary.
pub const NGINX_BINARY: &str = "/usr/sbin/nginx";

/// Why nginx could not be started.
#[derive(Debug, thiserror::Error)]
pub enum NginxError {
    #[error(
        "this scenario needs nginx as its load balancer ([topology] load_balancer = \"nginx\"), \
         but {0} does not exist; install it (apt-get install nginx) or set WEIR_LAB_NGINX"
    )]
    Missing(String),
    #[error("cannot prepare nginx's directory: {0}")]
    Setup(std::io::Error),
    #[error("cannot start {binary}: {source}")]
    Spawn {
        binary: String,
        source: std::io::Error,
    },
    #[error("nginx exited at start ({status}); its error log says:\n{log}")]
    Exited { status: String, log: String },
    #[error("nginx did not accept connections on {addr} within 10 s")]
    NotListening { addr: SocketAddr },
}

/// A running nginx; dropping it stops it.
#[derive(Debug)]
pub struct NginxProxy {
    pub addr: SocketAddr,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

impl NginxProxy {
    /// Starts nginx listening on a free loopback port and proxying to `upstream`.
    pub fn start(upstream: SocketAddr) -> Result<NginxProxy, NginxError> {
        let binary = std::env::var("WEIR_LAB_NGINX").unwrap_or_else(|_| NGINX_BINARY.to_string());
        if !std::path::Path::new(&binary).exists() {
            return Err(NginxError::Missing(binary));
        }
        let dir = tempfile::tempdir().map_err(NginxError::Setup)?;
        // Workers may run as `nobody` when started by root: let them reach temp paths.
        set_mode(&dir.path().to_path_buf());
        let addr = free_port().map_err(NginxError::Setup)?;
        let d = dir.path().display();
        let conf = format!(
            r#"worker_processes 1;
daemon off;
master_process on;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
worker_rlimit_nofile 16384;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    client_body_temp_path {d}/body;
    proxy_temp_path {d}/proxy;
    fastcgi_temp_path {d}/fastcgi;
    uwsgi_temp_path {d}/uwsgi;
    scgi_temp_path {d}/scgi;
    upstream weir {{
        server {upstream};
        keepalive 256;
    }}
    server {{
        listen {addr} backlog=4096;
        location / {{
            proxy_pass http://weir;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            proxy_set_header Host $host;
            proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
            proxy_read_timeout 60s;
            proxy_request_buffering off;
        }}
    }}
}}
"#
        );
        let conf_path = dir.path().join("nginx.conf");
        std::fs::write(&conf_path, conf).map_err(NginxError::Setup)?;
        let error_log = dir.path().join("error.log");
        let child = Command::new(&binary)
            .arg("-p")
            .arg(dir.path())
            .arg("-c")
            .arg(&conf_path)
            .arg("-e")
            .arg(&error_log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|source| NginxError::Spawn {
                binary: binary.clone(),
                source,
            })?;
        let mut proxy = NginxProxy {
            addr,
            child: Some(child),
            _dir: dir,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                return Ok(proxy);
            }
            if let Some(child) = proxy.child.as_mut()
                && let Ok(Some(status)) = child.try_wait()
            {
                proxy.child = None;
                let log = std::fs::read_to_string(&error_log).unwrap_or_default();
                return Err(NginxError::Exited {
                    status: status.to_string(),
                    log,
                });
            }
            if Instant::now() > deadline {
                return Err(NginxError::NotListening { addr });
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Stops nginx (SIGTERM to the master, SIGKILL after 5 s) and reaps it.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SIGTERM through kill(1): this crate has no unsafe code for libc::kill.
        let _ = Command::new("kill")
            .arg("-TERM")
            .arg(child.id().to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for NginxProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

fn set_mode(dir: &PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    // Best effort: nginx still runs when the directory stays private to its owner.
    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755));
}

/// A free loopback port; nginx binds it right after (a race only another binder can lose).
fn free_port() -> std::io::Result<SocketAddr> {
    let l = TcpListener::bind("127.0.0.1:0")?;
    l.local_addr()
}
