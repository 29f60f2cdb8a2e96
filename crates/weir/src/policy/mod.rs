//! Policy: which route and [`RouteClass`] a request belongs to, and the
//! [`Decision`] taken for it before it may reach an upstream.
//!
//! Routes are matched in order, first match wins; a route names a pool and a
//! class. Rules (rate and concurrency limits, challenges; later issues) hang
//! off classes. This stage only decides; it never touches the network.

pub mod decision;
pub mod route;
pub mod rules;

pub use decision::{
    Admitted, ChallengeInstead, Decision, PageWhen, Proof, RejectReason, ShedCause,
};
pub use route::{ClassSettings, Route, RouteClass, RouteTable};
