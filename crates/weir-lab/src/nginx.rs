//! A real nginx in the lab, two ways: as the load balancer in front of weir (incident 4:
//! a limit tested only by calling the service directly saw every request as the load
//! balancer's address once deployed behind one), and as a rival gateway in front of the
//! app, configured by a scenario variant (`gateway = "nginx"`), to measure weir against.
//!
//! Either way it runs `/usr/sbin/nginx` (or `$WEIR_LAB_NGINX`) in the foreground, one
//! worker, with its own temp dir for config, pid file, error log and temp paths (see
//! [`crate::process`]), and stops it by its process id. It does not install nginx, tune
//! a rival's config, or speak TLS.

use std::net::SocketAddr;

use super::process::{ProcessError, Program, ServerDir, ServerProcess};

/// nginx: `/usr/sbin/nginx` unless `WEIR_LAB_NGINX` names another binary.
pub const NGINX: Program = Program {
    name: "nginx",
    binary: "/usr/sbin/nginx",
    env: "WEIR_LAB_NGINX",
    package: "nginx",
};

/// Starts nginx as the load balancer in front of `upstreams` (weir, one
/// instance or a fleet, round-robin), adding
/// `X-Forwarded-For: $proxy_add_x_forwarded_for` over keep-alive upstream connections.
pub fn start_load_balancer(upstreams: &[SocketAddr]) -> Result<ServerProcess, ProcessError> {
    let dir = ServerDir::new(NGINX, "[topology] load_balancer = \"nginx\"")?;
    let servers: String = upstreams
        .iter()
        .map(|u| format!("        server {u};\n"))
        .collect();
    // A fleet: to the instance with the fewest requests under way, one
    // queue in effect rather than N (round-robin splits the app's slots
    // into N queues, and people wait in the busiest; docs/operations.md,
    // "The fleet lab").
    let balance = if upstreams.len() > 1 {
        "        least_conn;\n"
    } else {
        ""
    };
    let http = format!(
        r#"    upstream weir {{
{balance}{servers}        keepalive 256;
    }}
    server {{
        listen {listen} backlog=4096;
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
"#,
        listen = dir.listen
    );
    start(dir, &http)
}

/// Starts nginx as a rival gateway: `config` is the contents of its `http` block, with
/// `{{app}}`, `{{dir}}` and `{{listen}}` filled in.
pub fn start_gateway(config: &str, app: SocketAddr) -> Result<ServerProcess, ProcessError> {
    let dir = ServerDir::new(NGINX, "a variant with gateway = \"nginx\"")?;
    let http = dir.fill(config, app);
    start(dir, &http)
}

/// Replaces a running nginx's `http` block with `http` and reloads it
/// (SIGHUP: new workers take the new configuration, old ones finish what
/// they hold): how an operator switches a load balancer's upstream.
pub fn reconfigure(nginx: &ServerProcess, http: &str) -> Result<(), ProcessError> {
    nginx.write("nginx.conf", &main_config(nginx.dir(), http))?;
    nginx.signal(rustix::process::Signal::HUP);
    Ok(())
}

/// The whole `nginx.conf` around an `http` block's contents.
fn main_config(dir: &std::path::Path, http: &str) -> String {
    let d = dir.display();
    format!(
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
{http}
}}
"#
    )
}

fn start(dir: ServerDir, http: &str) -> Result<ServerProcess, ProcessError> {
    let conf = dir.write("nginx.conf", &main_config(dir.dir.path(), http))?;
    let error_log = dir.path("error.log");
    let prefix = dir.dir.path().to_path_buf();
    ServerProcess::start(
        dir,
        &[
            "-p".as_ref(),
            prefix.as_os_str(),
            "-c".as_ref(),
            conf.as_os_str(),
            "-e".as_ref(),
            error_log.as_os_str(),
        ],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rival_config_is_wrapped_in_the_labs_own_main_context() {
        let dir = ServerDir {
            program: NGINX,
            dir: tempfile::tempdir().expect("dir"),
            listen: "127.0.0.1:4321".parse().expect("literal"),
        };
        let app: SocketAddr = "127.0.0.1:8081".parse().expect("literal");
        let http = dir.fill(
            "upstream app { server {{app}}; }\nserver { listen {{listen}}; root {{dir}}; }",
            app,
        );
        let conf = main_config(dir.dir.path(), &http);
        let d = dir.dir.path().display().to_string();
        assert!(conf.contains("server 127.0.0.1:8081;"), "{conf}");
        assert!(conf.contains("listen 127.0.0.1:4321;"), "{conf}");
        assert!(conf.contains(&format!("root {d};")), "{conf}");
        assert!(conf.contains("daemon off;") && conf.contains(&format!("pid {d}/nginx.pid;")));
        // The variant's text sits inside the http block.
        let http_at = conf.find("http {").expect("http block");
        assert!(conf.find("upstream app").expect("upstream") > http_at);
    }
}
