//! The `weir` command line: `run`, `check`, `sim`, `demo` (and, as the lab lands,
//! `replay`). Errors are printed once, with their chain, here and only
//! here; exit status 2 for unusable input, 1 for failures.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use weir::config::{ProcessEnv, load_file};
use weir::gateway::Gateway;
use weir::server::Server;

#[derive(Parser)]
#[command(
    name = "weir",
    version,
    about = "An edge gateway that keeps a web app up under crawler floods without shutting people out"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the proxy.
    Run {
        /// Configuration file.
        #[arg(short, long, default_value = "weir.toml")]
        config: PathBuf,
        /// Write bound addresses as JSON to this file once serving
        /// (`{"listeners":[...],"admin":"...","pid":N}`).
        #[arg(long)]
        ready_file: Option<PathBuf>,
    },
    /// Validate a configuration file and report every problem with its line.
    Check {
        #[arg(short, long, default_value = "weir.toml")]
        config: PathBuf,
    },
    /// Run a lab scenario against each weir variant it defines; exit 1 if a check fails.
    Sim {
        /// Scenario file (see docs/lab.md).
        scenario: PathBuf,
        /// Run only this variant (repeatable; default: all).
        #[arg(long = "variant")]
        variants: Vec<String>,
        /// Write the full report as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
        /// Write a self-contained HTML report.
        #[arg(long)]
        html: Option<PathBuf>,
    },
    /// Replay access logs through a configuration, offline: who would it have
    /// rejected? (nginx/Apache combined, Caddy JSON, weir JSON; gzip too.)
    Replay {
        #[arg(short, long, default_value = "weir.toml")]
        config: PathBuf,
        /// Log files, merged in time order.
        #[arg(required = true)]
        logs: Vec<PathBuf>,
        /// Force the format: combined, caddy or weir (default: detect).
        #[arg(long)]
        format: Option<String>,
        /// Extra quoted fields after the user agent in combined logs, in order,
        /// e.g. `$http_cookie,$http_x_forwarded_for`.
        #[arg(long, value_delimiter = ',')]
        trailing: Vec<String>,
        /// Write the report as JSON.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Replay incident 1 (crawler flood) with and without weir's recommended config.
    Demo {
        /// Where to write the HTML report.
        #[arg(long, default_value = weir::lab::cli::DEMO_HTML)]
        html: PathBuf,
    },
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Check { config } => check(&config),
        Command::Run { config, ready_file } => run(&config, ready_file.as_deref()),
        Command::Sim {
            scenario,
            variants,
            json,
            html,
        } => {
            let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
            let options = weir::lab::cli::SimOptions {
                variants,
                json,
                html,
                progress,
            };
            weir::lab::cli::sim(&scenario, &options)
                .map(|r| {
                    if r.passed() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(1)
                    }
                })
                .map_err(anyhow::Error::from)
        }
        Command::Replay {
            config,
            logs,
            format,
            trailing,
            json,
        } => replay(
            &config,
            &logs,
            format.as_deref(),
            &trailing,
            json.as_deref(),
        ),
        Command::Demo { html } => {
            let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
            weir::lab::cli::demo(Some(html), progress)
                .map(|_| ExitCode::SUCCESS)
                .map_err(anyhow::Error::from)
        }
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("weir: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn check(path: &Path) -> anyhow::Result<ExitCode> {
    let outcome = load_file(path, &ProcessEnv).and_then(|l| Gateway::build(l, None, 1));
    match outcome {
        Ok(g) => {
            println!(
                "{}: ok ({} listeners, {} pools, {} routes)",
                path.display(),
                g.listeners.len(),
                g.pools.len(),
                g.routes.routes.len()
            );
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            for e in &errors.0 {
                eprintln!("{e}");
            }
            eprintln!("{}: {} problem(s)", path.display(), errors.0.len());
            Ok(ExitCode::from(2))
        }
    }
}

fn run(path: &Path, ready_file: Option<&Path>) -> anyhow::Result<ExitCode> {
    let loaded = load_file(path, &ProcessEnv).map_err(|e| anyhow::anyhow!("{e}"))?;
    let workers = match loaded.config.process.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .thread_name("weir-worker")
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let server = Server::start(loaded, Some(path.to_path_buf()), Box::new(ProcessEnv)).await?;
        tracing::info!(listeners = ?server.listeners, admin = ?server.admin, "weir is serving");
        if let Some(file) = ready_file {
            write_ready_file(file, &server).context("writing the ready file")?;
        }
        let drain_timeout = server.runtime.gateway.load().drain_timeout;
        wait_for_stop(&server).await;
        tracing::info!(?drain_timeout, "draining: finishing in-flight requests");
        let fast = tokio::spawn(async {
            second_signal().await;
        });
        let report = tokio::select! {
            r = server.drain(drain_timeout) => r,
            _ = fast => {
                tracing::warn!("second signal: stopping now");
                return Ok(ExitCode::SUCCESS);
            }
        };
        tracing::info!(forced = report.forced, took = ?report.took, "drained; exiting");
        Ok::<_, anyhow::Error>(ExitCode::SUCCESS)
    })
}

fn write_ready_file(path: &Path, server: &Server) -> std::io::Result<()> {
    let doc = serde_json::json!({
        "listeners": server.listeners.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
        "admin": server.admin.map(|a| a.to_string()),
        "pid": std::process::id(),
    });
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, doc.to_string())?;
    std::fs::rename(tmp, path)
}

/// Waits for SIGTERM or SIGINT; reloads on SIGHUP meanwhile.
async fn wait_for_stop(server: &Server) {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::hangup()),
    ) else {
        tracing::error!("cannot install signal handlers; waiting forever");
        std::future::pending::<()>().await;
        return;
    };
    loop {
        tokio::select! {
            _ = term.recv() => return,
            _ = int.recv() => return,
            _ = hup.recv() => {
                let rt = server.runtime.clone();
                let _ = tokio::task::spawn_blocking(move || rt.reload(true)).await;
            }
        }
    }
}

/// A second SIGTERM/SIGINT, or SIGQUIT, during a drain means stop now.
async fn second_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int), Ok(mut quit)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
        signal(SignalKind::quit()),
    ) else {
        std::future::pending::<()>().await;
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
        _ = quit.recv() => {}
    }
    let _ = Duration::ZERO;
}

fn replay(
    config: &Path,
    logs: &[PathBuf],
    format: Option<&str>,
    trailing: &[String],
    json: Option<&Path>,
) -> anyhow::Result<ExitCode> {
    use weir::lab::replay::{ReaderOptions, engine};
    let loaded = load_file(config, &ProcessEnv).map_err(|e| anyhow::anyhow!("{e}"))?;
    let gateway = Gateway::build(loaded, None, 1).map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut options = ReaderOptions::default();
    if let Some(f) = format {
        options.format = Some(f.parse().map_err(|e| anyhow::anyhow!("--format: {e}"))?);
    }
    for t in trailing {
        options.trailing.push(
            t.parse()
                .map_err(|e| anyhow::anyhow!("--trailing {t}: {e}"))?,
        );
    }
    let started = std::time::Instant::now();
    let run = engine::replay_files(gateway, logs, &options, |_, _| {})?;
    let took = started.elapsed();
    print!("{}", run.report);
    println!(
        "\n{} lines read in {:.2} s ({:.0} lines/s); {} malformed",
        run.lines,
        took.as_secs_f64(),
        run.lines as f64 / took.as_secs_f64().max(1e-9),
        run.malformed
    );
    for (file, line, error) in &run.malformed_examples {
        println!("  {}:{line}: {error}", logs[*file].display());
    }
    if let Some(path) = json {
        std::fs::write(path, serde_json::to_string_pretty(&run)?)
            .context("writing the JSON report")?;
    }
    Ok(ExitCode::SUCCESS)
}
