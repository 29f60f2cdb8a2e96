//! The `weir` command line: `run`, `upgrade`, `check`, `sim`, `demo` (and, as
//! the lab lands, `replay`). Errors are printed once, with their chain, here and only
//! here; exit status 2 for unusable input, 1 for failures.

#![cfg_attr(
    test,
    allow(clippy::too_many_lines, reason = "a test reads as one story")
)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{CommandFactory, Parser, Subcommand};

use weir::config::{LoadedConfig, ProcessEnv, load_file};
use weir::gateway::Gateway;
use weir::lifecycle::signals::{Request, Signals};
use weir::lifecycle::upgrade::{self, Handover, Taken, UpgradeSocket, Upgrader};
use weir::lifecycle::{Inherited, InheritedListener, systemd};
use weir::server::{Accepting, Server};

mod generate;
mod report;

// jemalloc over glibc malloc: it keeps short-lived buffers (a request's, a
// busy connection's) in other pages than long-lived small objects (an idle
// connection's task), so memory freed when connections go idle (they park,
// see `edge::serve`) goes back to the system. Measured in bench/README.md:
// 10,000 idle keep-alive connections take about a quarter of glibc's RSS.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings: a background thread returns freed pages after a
/// second (the default waits for further allocations, up to 10 s).
/// jemalloc reads this as its `const char *malloc_conf` (a nullable thin
/// pointer to a NUL-terminated string, which `Option<&u8>` is).
// The project's one unsafe item: the symbol name is how jemalloc finds it.
#[allow(non_upper_case_globals, unsafe_code)]
#[unsafe(export_name = "_rjem_malloc_conf")]
pub static malloc_conf: Option<&u8> =
    Some(&b"background_thread:true,dirty_decay_ms:1000,muzzy_decay_ms:0\0"[0]);

#[derive(Parser)]
#[command(
    name = "weir",
    version = weir::build_info::LONG_VERSION,
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
        /// Unix socket for in-place upgrades (`weir upgrade`, SIGUSR2).
        /// Default: `$RUNTIME_DIRECTORY`, `$XDG_RUNTIME_DIR` or the temp dir,
        /// named after the config file's path.
        #[arg(long)]
        upgrade_socket: Option<PathBuf>,
        /// How long a new process gets to report ready in an upgrade.
        #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
        upgrade_timeout: Duration,
        /// Internal: take listeners and limiter state over from the process
        /// listening on this upgrade socket (set by the old process).
        #[arg(long, hide = true)]
        inherit: Option<PathBuf>,
    },
    /// Replace the running `weir run` for this config with the executable now
    /// on disk, without refusing a connection; exits 0 once the new process
    /// serves, 1 if the upgrade failed (the old process then serves on).
    Upgrade {
        #[arg(short, long, default_value = "weir.toml")]
        config: PathBuf,
        /// The running process's upgrade socket (default as for `run`).
        #[arg(long)]
        upgrade_socket: Option<PathBuf>,
        /// How long to wait for the outcome.
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        timeout: Duration,
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
        /// Run each variant this long instead of the scenario's duration
        /// (e.g. `20s` for a quick look; at most 10m).
        #[arg(long, value_parser = humantime::parse_duration)]
        duration: Option<Duration>,
        /// Keep each weir variant's alert replay (a `promtool test rules` file of
        /// weir's series on the story's clock) in this directory, as VARIANT.yml.
        #[arg(long)]
        alert_series: Option<PathBuf>,
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
        /// Write a self-contained HTML report (a per-minute chart of
        /// rejections by rule, breakdowns by level, user agent and prefix).
        #[arg(long)]
        html: Option<PathBuf>,
        /// No progress bar (one is shown on stderr when it is a terminal).
        #[arg(long)]
        no_progress: bool,
    },
    /// Ordinary traffic (pages, uploads, downloads, long polls, events,
    /// WebSockets, HTTP/2) through each operation on weir (reload, upgrade,
    /// restarts, blue/green), next to nginx and no gateway: prints what
    /// visitors lost. Exit 1 when weir failed a request the app alone did not.
    Harm(HarmArgs),
    /// Replay incident 1 (crawler flood) with and without weir's recommended config.
    Demo {
        /// Where to write the HTML report.
        #[arg(long, default_value = weir_lab::cli::DEMO_HTML)]
        html: PathBuf,
    },
    /// Write the man pages or a shell's completion script (for packages).
    Generate {
        #[command(subcommand)]
        what: Generated,
    },
}

/// `weir harm`'s options.
#[derive(clap::Args)]
struct HarmArgs {
    /// A short run (a third of the traffic, three operations), as CI's.
    #[arg(long)]
    short: bool,
    /// Fronts to run: direct, nginx, weir (default: all).
    #[arg(long = "front", value_delimiter = ',')]
    fronts: Vec<String>,
    /// Operations: none, app_restart, reload, upgrade, restart,
    /// container_stop, reuse_port, activated, blue_green, rolling
    /// (default: all).
    #[arg(long = "op", value_delimiter = ',')]
    ops: Vec<String>,
    /// Write every row as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Only pages and uploads (issue 35's restart traffic): no
    /// downloads, long polls, events, WebSockets or HTTP/2.
    #[arg(long)]
    pages_and_uploads: bool,
    /// Instead: a soak of this long (e.g. `30m`) through weir, a reload
    /// a minute and an upgrade every five, weir's memory, descriptors
    /// and threads sampled.
    #[arg(long, value_parser = humantime::parse_duration)]
    soak: Option<Duration>,
}

impl Command {
    /// The lab's commands print a report; the weirs they run in-process log
    /// only warnings unless WEIR_LOG asks for more.
    fn default_log_level(&self) -> &'static str {
        match self {
            Command::Sim { .. }
            | Command::Demo { .. }
            | Command::Replay { .. }
            | Command::Harm(_) => "warn",
            _ => "info",
        }
    }
}

#[derive(Subcommand)]
enum Generated {
    /// Man pages (weir.1, weir-run.1, ...) into a directory.
    Man {
        /// Where to write them (created if missing).
        dir: PathBuf,
    },
    /// A shell's completion script, on stdout.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
}

/// weir's own log on stderr: filtered by `WEIR_LOG` (default `level`), as
/// text or JSON (`[log] format`, `WEIR_LOG_FORMAT`; asked per event, so the
/// configuration can switch it once read: weir::observe::process_log).
fn init_process_log(level: &str) {
    use tracing_subscriber::filter::filter_fn;
    use tracing_subscriber::prelude::*;
    use weir::observe::process_log;
    if let Some(format) = process_log::from_env() {
        process_log::set(format);
    }
    let text = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(filter_fn(|_| !process_log::json()));
    let json = tracing_subscriber::fmt::layer()
        .json()
        .with_writer(std::io::stderr)
        .with_filter(filter_fn(|_| process_log::json()));
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level)),
        )
        .with(text)
        .with(json)
        .init();
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_process_log(cli.command.default_log_level());
    match execute(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("weir: {}", report::describe(&e));
            ExitCode::from(2)
        }
    }
}

/// Runs the subcommand; its error is reported once, by `main`.
fn execute(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Check { config } => check(&config),
        Command::Run {
            config,
            ready_file,
            upgrade_socket,
            upgrade_timeout,
            inherit,
        } => {
            let socket = upgrade_socket.unwrap_or_else(|| upgrade::default_socket_path(&config));
            run(&RunOptions {
                config,
                ready_file,
                upgrade_socket: socket,
                upgrade_timeout,
                inherit,
            })
        }
        Command::Upgrade {
            config,
            upgrade_socket,
            timeout,
        } => {
            let socket = upgrade_socket.unwrap_or_else(|| upgrade::default_socket_path(&config));
            request_upgrade(&socket, timeout)
        }
        Command::Sim {
            scenario,
            variants,
            json,
            html,
            duration,
            alert_series,
        } => sim(
            &scenario,
            sim_options(variants, json, html, duration, alert_series),
        ),
        Command::Replay {
            config,
            logs,
            format,
            trailing,
            json,
            html,
            no_progress,
        } => replay(
            &config,
            &logs,
            format.as_deref(),
            &trailing,
            replay_outputs(json.as_deref(), html.as_deref(), no_progress),
        ),
        Command::Generate { what } => generated(what),
        Command::Harm(args) => harm(args),
        Command::Demo { html } => demo(html),
    }
}

/// `weir sim`'s flags as the lab's options, with progress on stderr.
fn sim_options(
    variants: Vec<String>,
    json: Option<PathBuf>,
    html: Option<PathBuf>,
    duration: Option<Duration>,
    alert_series: Option<PathBuf>,
) -> weir_lab::cli::SimOptions {
    weir_lab::cli::SimOptions {
        variants,
        json,
        html,
        progress: weir_lab::runner::Progress::for_stderr(),
        duration,
        alert_series,
        beside: None,
    }
}

/// Where `weir replay` writes its report; a progress bar unless
/// `no_progress` or stderr is not a terminal.
fn replay_outputs<'a>(
    json: Option<&'a Path>,
    html: Option<&'a Path>,
    no_progress: bool,
) -> ReplayOutputs<'a> {
    ReplayOutputs {
        json,
        html,
        progress: !no_progress && std::io::IsTerminal::is_terminal(&std::io::stderr()),
    }
}

/// `weir demo`: the lab's demo scenario, its report written to `html`.
fn demo(html: PathBuf) -> anyhow::Result<ExitCode> {
    weir_lab::cli::demo(Some(html), weir_lab::runner::Progress::for_stderr())
        .map(|_| ExitCode::SUCCESS)
        .map_err(anyhow::Error::from)
}

/// `weir sim`: runs a scenario's variants; exit 1 when a check failed.
fn sim(scenario: &Path, options: weir_lab::cli::SimOptions) -> anyhow::Result<ExitCode> {
    let report = weir_lab::cli::sim(scenario, &options)?;
    Ok(if report.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

/// `weir harm`: the harmlessness table, or a soak; exit 1 when weir did
/// harm (`weir_lab::ordinary::run::harmed`), or the soak failed a request
/// or grew.
fn harm(args: HarmArgs) -> anyhow::Result<ExitCode> {
    use weir_lab::ordinary::cli::{HarmOptions, harm, soak_command};
    use weir_lab::ordinary::front::{FrontKind, Operation};
    let weir = std::env::current_exe().context("where this weir binary is")?;
    let passed = match args.soak {
        Some(duration) => soak_command(weir, duration, args.json.as_deref())?,
        None => {
            let fronts = match args.fronts.as_slice() {
                [] => FrontKind::ALL.to_vec(),
                names => names
                    .iter()
                    .map(|n| {
                        FrontKind::from_name(n)
                            .with_context(|| format!("no front named {n:?} (direct, nginx, weir)"))
                    })
                    .collect::<anyhow::Result<_>>()?,
            };
            let ops = match args.ops.as_slice() {
                [] => Operation::ALL.to_vec(),
                keys => keys
                    .iter()
                    .map(|k| {
                        Operation::from_key(k).with_context(|| {
                            let known: Vec<_> = Operation::ALL.iter().map(|o| o.key()).collect();
                            format!("no operation named {k:?} ({})", known.join(", "))
                        })
                    })
                    .collect::<anyhow::Result<_>>()?,
            };
            harm(&HarmOptions {
                short: args.short,
                pages_and_uploads: args.pages_and_uploads,
                fronts,
                ops,
                weir,
                json: args.json,
            })?
        }
    };
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    })
}

fn generated(what: Generated) -> anyhow::Result<ExitCode> {
    match what {
        Generated::Man { dir } => {
            let pages = generate::man_pages(Cli::command(), &dir)
                .with_context(|| format!("writing man pages into {}", dir.display()))?;
            for p in pages {
                println!("{}", p.display());
            }
        }
        Generated::Completions { shell } => {
            generate::completions(Cli::command(), shell, &mut std::io::stdout().lock())
                .context("writing the completion script")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn check(path: &Path) -> anyhow::Result<ExitCode> {
    let mut host_warnings = Vec::new();
    let outcome = load_file(path, &ProcessEnv).and_then(|l| {
        let (host, warnings) = weir::gateway::process::host(&l, false);
        host_warnings = warnings;
        match (Gateway::build(l, None, 1), host.is_empty()) {
            (Ok(g), true) => Ok(g),
            (Ok(_), false) => Err(weir::config::ConfigErrors(host)),
            (Err(mut e), _) => {
                e.0.extend(host);
                Err(e)
            }
        }
    });
    match outcome {
        Ok(g) => {
            // Warnings never fail the check: the configuration runs.
            for w in g.warnings.iter().chain(&host_warnings) {
                eprintln!("warning: {w}");
            }
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

struct RunOptions {
    config: PathBuf,
    ready_file: Option<PathBuf>,
    upgrade_socket: PathBuf,
    upgrade_timeout: Duration,
    inherit: Option<PathBuf>,
}

fn run(opts: &RunOptions) -> anyhow::Result<ExitCode> {
    let path = opts.config.as_path();
    // Before any thread starts: it clears LISTEN_* from the environment.
    let activated = if opts.inherit.is_none() {
        systemd::activated_listeners()
    } else {
        Vec::new()
    };
    let loaded = load_file(path, &ProcessEnv).map_err(|e| anyhow::anyhow!("{e}"))?;
    let workers = match loaded.config.process.workers {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    };
    // Each worker is a thread with tokio's single-threaded scheduler (this
    // one, and `workers - 1` more started by the server, each accepting on
    // every listener). It runs woken tasks in order; the multi-threaded
    // one runs the task woken last first (its LIFO slot), which under
    // 1,000 busy connections served some quickly and left others waiting
    // (p99 5x nginx's with one thread, 9x with two).
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        // Names its blocking pool's threads: the first worker is this
        // (the main) thread, the others `weir-worker` (lifecycle::workers).
        .thread_name("weir-blocking")
        .build()
        .context("starting the async runtime")?;
    rt.block_on(serve_until_done(opts, loaded, activated, workers))
}

/// `weir run` once its runtime is up: starts the server on `workers`
/// threads (on sockets taken over in an upgrade, else `activated` or bound),
/// announces it, serves until a signal or an upgrade ends it, then drains.
async fn serve_until_done(
    opts: &RunOptions,
    loaded: LoadedConfig,
    activated: Vec<InheritedListener>,
    workers: usize,
) -> anyhow::Result<ExitCode> {
    // First, so a signal right after readiness is never fatal.
    let mut signals = Signals::install().context("installing signal handlers")?;
    let (inherited, taken_over, upgrade_socket) = take_over_or_listen(opts, activated).await?;
    let from_generation = inherited.from_generation;
    let server = Server::start_workers(
        loaded,
        Some(opts.config.clone()),
        Box::new(ProcessEnv),
        inherited,
        workers - 1,
    )
    .await?;
    let drain_timeout = server.runtime.gateway.load().drain_timeout;
    if let Some(generation) = from_generation {
        tracing::info!(
            "inherited {} listeners and {} limiter keys from generation {generation}",
            server.inherited_listeners,
            server.restored.keys()
        );
    }
    if let Some(taken) = taken_over {
        complete_take_over(taken, &server, opts.upgrade_timeout, drain_timeout).await?;
    }
    tracing::info!(listeners = ?server.listeners, admin = ?server.admin, "weir is serving");
    if let Some(file) = &opts.ready_file {
        write_ready_file(file, &server).context("writing the ready file")?;
    }
    systemd::notify_ready();
    let mut upgrader = Upgrader::start(upgrade_socket, opts.upgrade_timeout);

    let handover = match serve_until_stopped(&server, &mut signals, &mut upgrader).await {
        Ending::Drain => None,
        Ending::HandedOver(handover) => Some(handover),
        Ending::StopNow => {
            tracing::warn!("SIGQUIT: stopping now");
            let report = server
                .drain_unless(Duration::ZERO, Accepting::No, async {})
                .await;
            if let Some(s) = upgrader.socket() {
                s.remove();
            }
            tracing::info!(forced = report.forced, "stopped");
            return Ok(ExitCode::SUCCESS);
        }
    };
    drain(server, &mut signals, &upgrader, handover, drain_timeout).await;
    Ok(ExitCode::SUCCESS)
}

/// What `weir run` starts from: with `--inherit` (an upgrade), the previous
/// process's listeners and limiter state, the channel to report ready on
/// and the upgrade socket it passes on; otherwise the `activated` systemd
/// listeners and a freshly bound upgrade socket (none if that fails, which
/// disables upgrades but not serving).
async fn take_over_or_listen(
    opts: &RunOptions,
    activated: Vec<InheritedListener>,
) -> anyhow::Result<(Inherited, Option<Taken>, Option<UpgradeSocket>)> {
    Ok(match &opts.inherit {
        Some(from) => {
            let mut taken = Taken::connect(from, opts.upgrade_timeout)
                .await
                .with_context(|| format!("taking over from {}", from.display()))?;
            let inherited = std::mem::take(&mut taken.inherited);
            let socket = taken.upgrade_socket.take();
            (inherited, Some(taken), socket)
        }
        None => {
            let socket = match UpgradeSocket::bind(&opts.upgrade_socket) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::error!(error = %e, "in-place upgrades are disabled");
                    None
                }
            };
            let inherited = Inherited {
                listeners: activated,
                ..Inherited::default()
            };
            (inherited, None, socket)
        }
    })
}

/// The new process's side of an upgrade once it serves: reports ready to
/// the previous process, then merges (in the background) the final limiter
/// state that process sends once it has drained.
async fn complete_take_over(
    taken: Taken,
    server: &Server,
    upgrade_timeout: Duration,
    drain_timeout: Duration,
) -> anyhow::Result<()> {
    // Ready only once the old process has stopped accepting: then a
    // next upgrade can never reach it instead of us.
    let last = taken
        .report_ready(
            server.listeners.len() + usize::from(server.admin.is_some()),
            server.restored.keys(),
            upgrade_timeout,
        )
        .await
        .context("reporting ready to the previous process")?;
    let runtime = server.runtime.clone();
    let wait = drain_timeout + Duration::from_secs(10);
    tokio::spawn(async move {
        match last.merge_into(&runtime, wait).await {
            Ok(Some(report)) => tracing::info!(
                keys = report.restored(),
                "merged the previous process's final limiter state"
            ),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(error = %e, "no final limiter state from the previous process")
            }
        }
    });
    Ok(())
}

/// How serving ended.
// One value, once per process: boxing the handover would buy nothing.
#[allow(clippy::large_enum_variant)]
enum Ending {
    /// SIGTERM or SIGINT: drain, then exit.
    Drain,
    /// SIGQUIT: close every connection now.
    StopNow,
    /// A new process serves: drain, then hand it the final limiter state.
    HandedOver(Handover),
}

/// Answers signals and `weir upgrade` requests while serving: reloads,
/// reopens the access log, and tries upgrades (a failed one serves on),
/// until one of them ends serving.
async fn serve_until_stopped(
    server: &Server,
    signals: &mut Signals,
    upgrader: &mut Upgrader,
) -> Ending {
    loop {
        let (request, operator) = tokio::select! {
            r = signals.next() => (r, None),
            op = upgrader.requested() => (Request::Upgrade, Some(op)),
        };
        match request {
            Request::Drain => return Ending::Drain,
            Request::StopNow => return Ending::StopNow,
            Request::Reload => {
                let rt = server.runtime.clone();
                let _ = tokio::task::spawn_blocking(move || rt.reload(true)).await;
            }
            Request::ReopenLogs => match server.runtime.access_log.reopen() {
                Ok(true) => tracing::info!("SIGUSR1: access log reopened"),
                Ok(false) => tracing::info!("SIGUSR1: the access log is not a file"),
                Err(e) => {
                    tracing::error!(error = %e, "SIGUSR1: cannot reopen the access log; writing on to the old file")
                }
            },
            Request::Upgrade => {
                let outcome = upgrader.upgrade(&server.runtime, server.sockets()).await;
                let reply = outcome.as_ref().map(|h| h.pid).map_err(|e| e.to_string());
                if let Some(op) = operator {
                    op.reply(reply).await;
                }
                if let Ok(handover) = outcome {
                    return Ending::HandedOver(handover);
                }
            }
        }
    }
}

/// Finishes in-flight requests for up to `drain_timeout` (a second signal
/// cuts it short). Without a `handover` this process is the last: systemd
/// hears it stopping and the upgrade socket goes. With one, the new
/// process gets the final limiter state once the drain is done.
async fn drain(
    server: Server,
    signals: &mut Signals,
    upgrader: &Upgrader,
    handover: Option<Handover>,
    drain_timeout: Duration,
) {
    let runtime = server.runtime.clone();
    if handover.is_none() {
        systemd::notify_stopping();
        if let Some(s) = upgrader.socket() {
            s.remove();
        }
    }
    tracing::info!(?drain_timeout, "draining: finishing in-flight requests");
    // A successor has the sockets after an upgrade; else this process keeps
    // accepting while its earlier work finishes (a plain stop and start).
    let accepting = match handover {
        Some(_) => Accepting::No,
        None => Accepting::WhileEarlierWork,
    };
    let report = server
        .drain_unless(drain_timeout, accepting, async {
            signals.stop_now().await;
            tracing::warn!("second signal: stopping now");
        })
        .await;
    tracing::info!(forced = report.forced, took = ?report.took, "drained; exiting");
    if let Some(handover) = handover {
        handover.finish(&runtime).await;
    }
}

fn request_upgrade(socket: &Path, timeout: Duration) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    match rt.block_on(upgrade::request(socket, timeout)) {
        Ok(pid) => {
            println!("upgraded: pid {pid} is serving");
            Ok(ExitCode::SUCCESS)
        }
        Err(why) => {
            eprintln!("weir: upgrade failed (the running process serves on): {why}");
            Ok(ExitCode::from(1))
        }
    }
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

/// Where `weir replay` writes besides standard output.
struct ReplayOutputs<'a> {
    json: Option<&'a Path>,
    html: Option<&'a Path>,
    /// A progress bar on stderr, by bytes of the files read.
    progress: bool,
}

fn replay(
    config: &Path,
    logs: &[PathBuf],
    format: Option<&str>,
    trailing: &[String],
    out: ReplayOutputs<'_>,
) -> anyhow::Result<ExitCode> {
    use weir_replay::{ReaderOptions, engine};
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
    let bar = out.progress.then(|| replay_progress(logs, &mut options));
    let started = std::time::Instant::now();
    let run = engine::replay_files(gateway, logs, &options, |_, _| {});
    if let Some((bar, ticker)) = bar {
        ticker.stop();
        bar.finish_and_clear();
    }
    let run = run?;
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
    if let Some(path) = out.json {
        std::fs::write(path, serde_json::to_string_pretty(&run)?)
            .with_context(|| format!("writing the JSON report to {}", path.display()))?;
    }
    if let Some(path) = out.html {
        let sources: Vec<String> = logs.iter().map(|p| p.display().to_string()).collect();
        std::fs::write(path, weir_replay::html::report(&run, &sources))
            .with_context(|| format!("writing the HTML report to {}", path.display()))?;
        println!("HTML report: {}", path.display());
    }
    Ok(ExitCode::SUCCESS)
}

/// Polls a byte count into a progress bar from a thread of its own, so
/// that the replay's loop pays one relaxed add per 256 KiB read for it.
struct Ticker {
    stop: std::sync::mpsc::Sender<()>,
    thread: std::thread::JoinHandle<()>,
}

impl Ticker {
    fn stop(self) {
        drop(self.stop);
        let _ = self.thread.join();
    }
}

/// A progress bar over the logs' sizes (compressed, as read), fed from
/// `options.bytes_read`.
fn replay_progress(
    logs: &[PathBuf],
    options: &mut weir_replay::ReaderOptions,
) -> (indicatif::ProgressBar, Ticker) {
    let total: u64 = logs
        .iter()
        .filter_map(|p| std::fs::metadata(p).ok())
        .map(|m| m.len())
        .sum();
    let bar = indicatif::ProgressBar::new(total).with_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} replaying [{bar:32}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
        )
        .expect("a valid template")
        .progress_chars("=> "),
    );
    // Drawn at once: a small log is done before the first tick.
    bar.tick();
    let count = weir_replay::ByteCount::default();
    options.bytes_read = Some(count.clone());
    let (stop, stopped) = std::sync::mpsc::channel::<()>();
    let shown = bar.clone();
    let thread = std::thread::spawn(move || {
        while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) =
            stopped.recv_timeout(Duration::from_millis(100))
        {
            shown.set_position(count.get());
        }
    });
    (bar, Ticker { stop, thread })
}
