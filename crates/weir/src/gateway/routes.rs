//! Compiling `[[routes]]`: each route's pool resolved, its matchers
//! compiled (regexes, methods, header names, hosts lowercased), and its
//! class's settings and rules attached. With no routes and one pool, one
//! route sends everything there as class `default`.

use std::collections::HashMap;

use super::classes::Classes;
use crate::config::{ConfigError, KeyPath, LoadedConfig, RouteConfig};
use crate::policy::route::HostMatch;
use crate::policy::{Route, RouteClass};

pub(super) fn routes(
    loaded: &LoadedConfig,
    pool_index: &HashMap<&str, usize>,
    classes: &Classes,
    errors: &mut Vec<ConfigError>,
) -> Vec<Route> {
    let cfg = &loaded.config;
    let root = KeyPath::root();
    let mut routes = Vec::new();
    if cfg.routes.is_empty() {
        match cfg.pools.len() {
            1 => routes.push(class_route(loaded, classes, "default", 0)),
            0 => errors.push(loaded.error_at(&root.key("pools"), "at least one pool is required")),
            _ => errors.push(loaded.error_at(
                &root.key("routes"),
                "with several pools, [[routes]] must say which pool serves what",
            )),
        }
    }
    for (i, r) in cfg.routes.iter().enumerate() {
        let at = root.key("routes").index(i);
        let Some(&pool) = pool_index.get(r.pool.as_str()) else {
            // A pool that failed to build has its own errors already.
            if !cfg.pools.contains_key(&r.pool) {
                let known: Vec<&str> = cfg.pools.keys().map(String::as_str).collect();
                errors.push(loaded.error_at(
                    &at.key("pool"),
                    format!("no pool named `{}` (pools: {})", r.pool, known.join(", ")),
                ));
            }
            continue;
        };
        routes.push(route(loaded, &at, r, pool, classes, errors));
    }
    routes
}

/// One configured route with its matchers.
fn route(
    loaded: &LoadedConfig,
    at: &KeyPath,
    r: &RouteConfig,
    pool: usize,
    classes: &Classes,
    errors: &mut Vec<ConfigError>,
) -> Route {
    let path_regex = match r.path_regex.as_deref().map(regex::Regex::new) {
        None => None,
        Some(Ok(re)) => Some(re),
        Some(Err(e)) => {
            errors.push(loaded.error_at(&at.key("path_regex"), format!("invalid regex: {e}")));
            None
        }
    };
    let mut methods = Vec::new();
    for (j, m) in r.methods.iter().enumerate() {
        match http::Method::from_bytes(m.to_ascii_uppercase().as_bytes()) {
            Ok(m) => methods.push(m),
            Err(_) => errors.push(loaded.error_at(
                &at.key("methods").index(j),
                format!("`{m}` is not an HTTP method"),
            )),
        }
    }
    let mut headers = Vec::new();
    for (j, h) in r.headers.iter().enumerate() {
        match http::HeaderName::from_bytes(h.to_ascii_lowercase().as_bytes()) {
            Ok(h) => headers.push(h),
            Err(_) => errors.push(loaded.error_at(
                &at.key("headers").index(j),
                format!("`{h}` is not a header name"),
            )),
        }
    }
    if r.class.is_empty() {
        errors.push(loaded.error_at(&at.key("class"), "must not be empty"));
    }
    Route {
        host: r.host.as_deref().map(HostMatch::parse),
        path_prefix: r.path_prefix.clone(),
        path_regex,
        methods,
        query_keys: r.query_keys.clone(),
        headers,
        cookies: r.cookies.clone(),
        ..class_route(loaded, classes, &r.class, pool)
    }
}

/// A route to `pool` that matches everything, with `class`'s settings,
/// rules and challenge (a class the configuration does not name has the
/// defaults and no rules).
fn class_route(loaded: &LoadedConfig, classes: &Classes, class: &str, pool: usize) -> Route {
    Route {
        pool,
        class: RouteClass::new(class),
        settings: classes
            .settings
            .get(class)
            .copied()
            .unwrap_or(classes.default),
        rules: classes
            .rules
            .get(class)
            .cloned()
            .unwrap_or_else(|| std::sync::Arc::from(Vec::new())),
        challenge: loaded
            .config
            .classes
            .get(class)
            .map(|c| c.challenge)
            .unwrap_or_default(),
        host: None,
        path_prefix: None,
        path_regex: None,
        methods: vec![],
        query_keys: vec![],
        headers: vec![],
        cookies: vec![],
    }
}
