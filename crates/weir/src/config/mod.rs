//! Configuration: the TOML schema, `${VAR}` substitution, validation and loading.
//!
//! This module owns the *file* view of configuration: serde structs that mirror
//! the TOML, each field documented with its default. It does not build runtime
//! state; [`crate::gateway::Gateway::build`] turns a validated [`Config`] into
//! values that cannot be invalid (compiled routes, CIDR tables, durations).
//!
//! Every key is documented in `docs/configuration.md`; a test keeps the two in
//! step.

mod env;
mod load;
mod schema;
mod secret;

pub use env::{Env, ProcessEnv};
pub(crate) use load::digest;
pub use load::{
    ConfigError, ConfigErrors, KeyPath, LoadedConfig, TomlLocator, line_of, load_file, load_str,
};
pub use schema::*;
pub use secret::Secret;
