//! The challenge's key for a fleet: several weir instances that share a
//! Redis (`state.redis_url`) and were given no `challenge.keys` sign and
//! verify with one key kept in that Redis, so a pass, a visit or a
//! challenge answer from one instance is good at every other. Without it
//! each instance signed with its own key (its state directory's): behind a
//! round-robin balancer a browser solved a challenge on one instance and
//! was challenged again on the next, page after page (issue 56: 265-316
//! documents for one page).
//!
//! Owns: storing the first key offered under `{redis_prefix}challenge:key`
//! (`SET NX`, so every instance ends with the same one) and reading it
//! back, once per start and reload. Does not: decide which keys sign
//! ([`super::keyfile::signing_keys`]), or share limits (`crate::state`).
//!
//! Whoever can read weir's Redis can sign passes with the key; weir's
//! Redis already holds every limit's state, and is as private as the key
//! file. With `redis_sentinel`, the key is kept on the primary the
//! sentinels name (a failover before it was replicated loses it; the
//! instances then agree on a new one at their next reload).

use std::sync::Mutex;
use std::time::Duration;

use crate::config::StateConfig;

/// The key's name after the deployment's `redis_prefix`.
const KEY_NAME: &str = "challenge:key";

/// The fleet's key, once read: kept for the process, so a reload while
/// Redis is down goes on signing with it.
static FLEET_KEY: Mutex<Option<String>> = Mutex::new(None);

/// Why the fleet's key could not be read from Redis.
#[derive(Debug, thiserror::Error)]
pub enum FleetKeyError {
    #[error(transparent)]
    Setup(#[from] weir_limiter::redis::RedisSetupError),
    #[error("{0}")]
    Redis(#[from] redis::RedisError),
    #[error("no answer from Redis within {0:?}")]
    Timeout(Duration),
    #[error("the key in Redis is {0} bytes, too short to sign with (at least 32)")]
    Short(usize),
    #[error("cannot start a thread to ask Redis: {0}")]
    Thread(std::io::Error),
}

/// The fleet's key, if this process has read one.
pub fn current() -> Option<String> {
    FLEET_KEY.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// Reads the fleet's key from the Redis of `state`, storing `offer` first
/// if no instance has yet; keeps it for [`current`]. Nothing is done when
/// `state` names no `redis_url`. Waits at most the Redis connect timeout
/// plus its command timeout, on a thread of its own (a start or a reload
/// may run on the runtime's threads).
pub fn fetch(state: &StateConfig, offer: &str) -> Result<Option<String>, FleetKeyError> {
    let Some(store) = Store::of(state)? else {
        return Ok(None);
    };
    let name = format!("{}{KEY_NAME}", state.redis_prefix);
    let offer = offer.to_owned();
    let wait = state.redis_connect_timeout.0 + state.redis_command_timeout.0;
    let asked = std::thread::Builder::new()
        .name("weir-fleet-key".into())
        .spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(FleetKeyError::Thread)?;
            runtime.block_on(async {
                let asked = store.stored_or_offered(&name, &offer);
                tokio::time::timeout(wait, asked)
                    .await
                    .map_err(|_| FleetKeyError::Timeout(wait))?
            })
        })
        .map_err(FleetKeyError::Thread)?
        .join()
        .unwrap_or(Err(FleetKeyError::Timeout(wait)))?;
    if asked.len() < super::keyring::MIN_KEY_BYTES {
        return Err(FleetKeyError::Short(asked.len()));
    }
    *FLEET_KEY.lock().unwrap_or_else(|e| e.into_inner()) = Some(asked.clone());
    Ok(Some(asked))
}

/// Where the fleet's key is kept: the shared Redis, or the primary the
/// sentinels name.
enum Store {
    Url(redis::Client),
    Cluster(redis::cluster::ClusterClient),
    Sentinel {
        sentinel: redis::sentinel::Sentinel,
        master: String,
        node: redis::sentinel::SentinelNodeConnectionInfo,
    },
}

impl Store {
    /// The store `state` shares limits through, if any (the URL first, as
    /// the limits take it).
    fn of(state: &StateConfig) -> Result<Option<Store>, FleetKeyError> {
        if let Some(url) = &state.redis_url {
            let tls = weir_limiter::redis::RedisTls::from_config(
                state.redis_ca_file.as_deref().map(std::path::Path::new),
            )?;
            let client = weir_limiter::redis::check_settings_with(url, &state.redis_prefix, &tls)?;
            return Ok(Some(Store::Url(client)));
        }
        if let Some(nodes) = &state.redis_cluster {
            let timeouts = weir_limiter::redis::RedisTimeouts {
                connect: state.redis_connect_timeout.0,
                command: state.redis_command_timeout.0,
                ..Default::default()
            };
            let client =
                weir_limiter::redis::check_cluster_settings(nodes, &state.redis_prefix, timeouts)?;
            return Ok(Some(Store::Cluster(client)));
        }
        let Some(sentinel) = &state.redis_sentinel else {
            return Ok(None);
        };
        let settings = sentinel.settings();
        Ok(Some(Store::Sentinel {
            sentinel: weir_limiter::redis::check_sentinel_settings(&settings, &state.redis_prefix)?,
            master: settings.master.clone(),
            node: weir_limiter::redis::sentinel_node(&settings),
        }))
    }

    /// `SET name offer NX`, then `GET name`, where the store keeps `name`.
    async fn stored_or_offered(self, name: &str, offer: &str) -> Result<String, FleetKeyError> {
        let client = match self {
            Store::Cluster(client) => {
                let mut conn = client.get_async_connection().await?;
                return stored_or_offered(&mut conn, name, offer).await;
            }
            Store::Url(client) => client,
            Store::Sentinel {
                mut sentinel,
                master,
                node,
            } => sentinel.async_master_for(&master, Some(&node)).await?,
        };
        let mut conn = client.get_multiplexed_async_connection().await?;
        stored_or_offered(&mut conn, name, offer).await
    }
}

/// `SET name offer NX`, then `GET name`: the first instance's offer wins.
async fn stored_or_offered(
    conn: &mut impl redis::aio::ConnectionLike,
    name: &str,
    offer: &str,
) -> Result<String, FleetKeyError> {
    let _: Option<String> = redis::cmd("SET")
        .arg(name)
        .arg(offer)
        .arg("NX")
        .query_async(conn)
        .await?;
    let key: String = redis::cmd("GET").arg(name).query_async(conn).await?;
    Ok(key)
}
