//! The text of a weir config for a test. Nearly every test's config starts
//! with the same tables (a listener on `127.0.0.1:0`, one pool, routes that
//! send classes to it, often the admin endpoint and the access log off);
//! [`WeirConfig`] writes those, so a test spells out as TOML only the part
//! it is about.
//!
//! Owns: the text of those common tables, in the order they are asked for.
//!
//! Does not: check the config (weir does) or know what a key means.
//!
//! ```ignore
//! let toml = WeirConfig::new(up.addr)
//!     .route_with("expensive", r#"query_keys = ["search"]"#)
//!     .route("page")
//!     .then(r#"[[classes.expensive.rules]]
//! name = "one-search"
//! limits = [{ per = "ip", rate = 1, window = "10m" }]
//! "#)
//!     .toml();
//! ```

use std::fmt::Display;

/// A weir config under construction: one listener, one pool, then routes and
/// tables in the order they were added.
pub struct WeirConfig {
    listener_keys: String,
    more_listeners: Vec<String>,
    pool: String,
    servers: Vec<String>,
    parts: Vec<Part>,
}

enum Part {
    /// A `[[routes]]` entry to the pool for `class`, with extra keys.
    Route { class: String, keys: String },
    /// Tables as they are written.
    Toml(String),
}

impl WeirConfig {
    /// One listener on `127.0.0.1:0` and the pool `app` with one server.
    pub fn new(server: impl Display) -> Self {
        Self::servers(&[server])
    }

    /// One listener on `127.0.0.1:0` and the pool `app` with `servers`.
    pub fn servers(servers: &[impl Display]) -> Self {
        Self {
            listener_keys: String::new(),
            more_listeners: Vec::new(),
            pool: "app".to_owned(),
            servers: servers.iter().map(|s| s.to_string()).collect(),
            parts: Vec::new(),
        }
    }

    /// Names the pool `name` instead of `app` (routes go to it).
    pub fn pool_name(mut self, name: &str) -> Self {
        self.pool = name.to_owned();
        self
    }

    /// More keys of the listener (e.g. `tls = { cert = "...", key = "..." }`).
    pub fn listener_keys(mut self, keys: &str) -> Self {
        self.listener_keys = keys.to_owned();
        self
    }

    /// Another listener on `127.0.0.1:0`, after the first, with `keys`.
    pub fn another_listener(mut self, keys: &str) -> Self {
        self.more_listeners.push(keys.to_owned());
        self
    }

    /// Another listener on `127.0.0.1:0` serving TLS with the certificate
    /// and key in these files (see `support::tls::tls_files`).
    pub fn tls_listener(self, cert: &str, key: &str) -> Self {
        self.another_listener(&format!("tls = {{ cert = \"{cert}\", key = \"{key}\" }}"))
    }

    /// A route sending `class` to the pool, for every request it matches.
    pub fn route(self, class: &str) -> Self {
        self.route_with(class, "")
    }

    /// A route sending `class` to the pool, with more keys that say which
    /// requests it matches (`query_keys = ["search"]`, `path_prefix = ...`).
    pub fn route_with(mut self, class: &str, keys: &str) -> Self {
        self.parts.push(Part::Route {
            class: class.to_owned(),
            keys: keys.to_owned(),
        });
        self
    }

    /// The pool's `[pools.NAME.admission]` table with `keys`.
    pub fn admission(self, keys: &str) -> Self {
        let table = format!("[pools.{}.admission]\n{keys}", self.pool);
        self.then(table)
    }

    /// The challenge, signing its passes with `key`, its proof of work
    /// `difficulty` bits.
    pub fn challenge(self, key: &str, difficulty: u8) -> Self {
        self.then(format!(
            "[challenge]\nkeys = [\"{key}\"]\ndifficulty = {difficulty}"
        ))
    }

    /// The admin endpoint on `127.0.0.1:0`.
    pub fn admin(self) -> Self {
        self.then("[admin]\naddress = \"127.0.0.1:0\"\n")
    }

    /// No access log.
    pub fn access_log_off(self) -> Self {
        self.then("[access_log]\ntarget = \"off\"\n")
    }

    /// More tables, as TOML; they must start with a table header, so that
    /// their keys do not land in the table before.
    pub fn then(mut self, tables: impl Into<String>) -> Self {
        self.parts.push(Part::Toml(tables.into()));
        self
    }

    /// The config's text.
    pub fn toml(&self) -> String {
        let servers: Vec<String> = self.servers.iter().map(|s| format!("\"{s}\"")).collect();
        let mut text = format!(
            "[[listeners]]\naddress = \"127.0.0.1:0\"\n{}\n",
            self.listener_keys
        );
        for keys in &self.more_listeners {
            text.push_str(&format!(
                "[[listeners]]\naddress = \"127.0.0.1:0\"\n{keys}\n"
            ));
        }
        text.push_str(&format!(
            "[pools.{pool}]\nservers = [{servers}]\n",
            pool = self.pool,
            servers = servers.join(", "),
        ));
        for part in &self.parts {
            match part {
                Part::Route { class, keys } => text.push_str(&format!(
                    "\n[[routes]]\npool = \"{}\"\nclass = \"{class}\"\n{keys}\n",
                    self.pool
                )),
                Part::Toml(tables) => {
                    text.push('\n');
                    text.push_str(tables);
                    text.push('\n');
                }
            }
        }
        text
    }
}

impl From<WeirConfig> for String {
    fn from(config: WeirConfig) -> String {
        config.toml()
    }
}
