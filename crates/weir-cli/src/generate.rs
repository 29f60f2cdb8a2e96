//! `weir generate`: the man pages and shell completions a package installs,
//! made from the same clap definition the binary parses with, so they can
//! never disagree with it (ripgrep's `--generate` does the same).
//!
//! Owns only the rendering; what the arguments are is `main.rs`'s.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Command;
use clap_mangen::Man;
use clap_mangen::roff::{Roff, bold, italic, roman};

/// Man pages: `weir.1` for the command and `weir-SUB.1` for each visible
/// subcommand, written into `dir` (created if missing). Returns the files.
pub fn man_pages(mut cmd: Command, dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    cmd = cmd.disable_help_subcommand(true);
    cmd.build();
    let mut written = Vec::new();
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        written.push(page(sub.clone()).generate_to(dir)?);
    }
    let main = page(cmd);
    let path = dir.join(main.get_filename());
    let mut file = std::fs::File::create(&path)?;
    main.render(&mut file)?;
    operator_sections().to_writer(&mut file)?;
    file.flush()?;
    written.push(path);
    Ok(written)
}

fn page(cmd: Command) -> Man {
    Man::new(cmd)
        .date(weir::build_info::BUILD_DATE)
        .source(format!("weir {}", weir::build_info::VERSION))
        .manual("System Administration")
        .section("1")
}

/// What an operator looks for in `man weir` beyond the flags: files,
/// signals, exit status, environment, as (section, [(term, text)]). The
/// details live in docs/; these are the facts needed at a console.
const OPERATOR_SECTIONS: &[(&str, &[(&str, &str)])] = &[
    (
        "FILES",
        &[
            (
                "/etc/weir/weir.toml",
                "The configuration (the package's default: a listener on :8080 in front of 127.0.0.1:8081). Validate it with weir check -c FILE before a reload.",
            ),
            (
                "/var/lib/weir",
                "Limiter state snapshots ([state] snapshot_dir), kept across restarts.",
            ),
            (
                "/run/weir",
                "The in-place upgrade socket (systemd's RuntimeDirectory).",
            ),
        ],
    ),
    (
        "SIGNALS",
        &[
            (
                "SIGTERM, SIGINT",
                "Drain: stop accepting, finish in-flight requests up to process.drain_timeout, write the limiter snapshot, exit 0. A second signal stops at once.",
            ),
            (
                "SIGQUIT",
                "Stop now: close every connection, write the snapshot, exit 0.",
            ),
            (
                "SIGHUP",
                "Reload the configuration. A configuration that fails to load is logged and the old one keeps serving.",
            ),
            ("SIGUSR1", "Reopen the access-log file (logrotate)."),
            (
                "SIGUSR2",
                "In-place upgrade to the executable now on disk (as weir upgrade).",
            ),
        ],
    ),
    (
        "EXIT STATUS",
        &[
            ("0", "Success; a drained stop."),
            (
                "1",
                "A failure at run time (a failed upgrade, a sim check that failed).",
            ),
            (
                "2",
                "Unusable input: an invalid configuration, scenario or log.",
            ),
        ],
    ),
    (
        "ENVIRONMENT",
        &[
            (
                "WEIR_LOG",
                "The process log's filter, in tracing's syntax (e.g. info, weir=debug).",
            ),
            (
                "WEIR_LOG_FORMAT",
                "text or json: the process log's format before the configuration is read ([log] format after).",
            ),
            (
                "LISTEN_FDS, LISTEN_PID",
                "systemd socket activation: each passed socket serves the [[listeners]] entry with its address.",
            ),
        ],
    ),
];

/// [`OPERATOR_SECTIONS`] as roff, then SEE ALSO.
fn operator_sections() -> Roff {
    let mut r = Roff::new();
    for (section, items) in OPERATOR_SECTIONS {
        r.control("SH", [*section]);
        for (term, text) in *items {
            r.control("TP", [] as [&str; 0])
                .text([bold(*term)])
                .text([roman(*text)]);
        }
    }
    r.control("SH", ["SEE ALSO"]);
    r.text([
        italic("weir-run"),
        roman("(1), "),
        italic("weir-check"),
        roman("(1), "),
        italic("weir-upgrade"),
        roman("(1), "),
        italic("systemd.socket"),
        roman("(5). The configuration keys, metrics and alerts are documented in /usr/share/doc/weir and at the project's docs/ folder."),
    ]);
    r
}

/// One shell's completion script, on `out`. Rendered into memory first:
/// clap_complete panics on a failed write (a closed pipe, `| head`), and a
/// write error here is an error like any other.
pub fn completions(
    mut cmd: Command,
    shell: clap_complete::Shell,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let mut script = Vec::new();
    clap_complete::generate(shell, &mut cmd, "weir", &mut script);
    out.write_all(&script)?;
    out.flush()
}
