//! Compiling `[pools.NAME]`: each pool built, or carried over from the
//! previous gateway when its definition did not change (with its warm
//! connections, health and admission state).

use std::collections::HashMap;
use std::sync::Arc;

use super::Gateway;
use crate::config::{ConfigError, KeyPath, LoadedConfig};
use crate::upstream::Pool;

/// The pools, and each one's index by name.
pub(super) fn pools<'a>(
    loaded: &'a LoadedConfig,
    previous: Option<&Gateway>,
    errors: &mut Vec<ConfigError>,
) -> (Vec<Arc<Pool>>, HashMap<&'a str, usize>) {
    let cfg = &loaded.config;
    let root = KeyPath::root();
    let mut pools: Vec<Arc<Pool>> = Vec::new();
    let mut pool_index: HashMap<&str, usize> = HashMap::new();
    for (name, def) in &cfg.pools {
        let reused = previous.and_then(|p| {
            p.pools
                .iter()
                .find(|old| &*old.name == name.as_str() && old.definition == *def)
                .cloned()
        });
        let before = previous.and_then(|p| p.pools.iter().find(|old| &*old.name == name.as_str()));
        let pool = match reused {
            Some(p) => p,
            None => match Pool::build(name, def, before.map(|p| &**p)) {
                Ok(p) => Arc::new(p),
                Err(errs) => {
                    for (i, e) in errs {
                        let pool_at = root.key("pools").key(name);
                        let at = match e.key() {
                            Some(keys) => keys.iter().fold(pool_at, |at, k| at.key(k)),
                            None if def.servers.is_empty() => pool_at.key("servers"),
                            None => pool_at.key("servers").index(i),
                        };
                        errors.push(loaded.error_at(&at, e.to_string()));
                    }
                    continue;
                }
            },
        };
        pool_index.insert(name.as_str(), pools.len());
        pools.push(pool);
    }
    (pools, pool_index)
}
