//! A real Redis in the lab: the store a fleet of weir instances shares its
//! limits through (`[state] redis_url`), for runs of several instances.
//!
//! It runs `/usr/bin/redis-server` (or `$WEIR_LAB_REDIS`) in the
//! foreground on a loopback port, without persistence, in its own temp dir
//! ([`crate::process`]), and stops it by its process id. It does not
//! install Redis, or run a Sentinel or a cluster.

use super::process::{ProcessError, Program, ServerDir, ServerProcess};

/// redis-server: `/usr/bin/redis-server` unless `WEIR_LAB_REDIS` names
/// another binary.
pub const REDIS: Program = Program {
    name: "redis",
    binary: "/usr/bin/redis-server",
    env: "WEIR_LAB_REDIS",
    package: "redis-server",
};

/// Starts Redis for a fleet's shared limits (`why` names the run that
/// needs it, for the error when it is not installed).
pub fn start(why: &str) -> Result<ServerProcess, ProcessError> {
    let dir = ServerDir::new(REDIS, why)?;
    let conf = dir.write(
        "redis.conf",
        &format!(
            "bind 127.0.0.1\nport {port}\ndir {dir}\nlogfile \"\"\ndaemonize no\n\
             save \"\"\nappendonly no\n",
            port = dir.listen.port(),
            dir = dir.path("").display(),
        ),
    )?;
    ServerProcess::start(dir, &[conf.as_os_str()])
}
