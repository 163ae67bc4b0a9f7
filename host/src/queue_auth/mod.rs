//! Who may use the rollout queue, and for what.
//!
//! The rollout queue (NATS JetStream) carries each tenant's RL groups to that tenant's workers
//! and their trajectories back. On a server shared by tenants, a worker holding one tenant's key
//! must neither take another tenant's groups nor answer them, and a stranger who reaches NATS
//! must do nothing at all. NATS's own answer is its decentralized authentication ("operator
//! mode"): the NATS server trusts an operator key; the operator signs an account; the account's
//! key signs users, each a JWT that lists the subjects the user may publish and subscribe to.
//! NATS checks every publish and subscription of a connection against its user's lists, so a
//! permission is enforced where the messages are, not by the parties' good faith.
//!
//! Here:
//! - [`QueueKeys::generate`] makes the operator, the system account and the account the
//!   rollout queue lives in, and writes what the NATS server needs (`nats-accounts.conf`, to
//!   `include` from its configuration) and the account's key (`account.nk`), which only
//!   `opentinker serve` holds (`--rollout-key`). `opentinker rollout-keys DIR` runs it.
//! - [`QueueAuthority`] is that key, loaded: it signs users. The server signs one for itself
//!   with no limits ([`QueueAuthority::unrestricted`]) and one for each worker that asks with a
//!   tenant's key, limited to the [`Permissions`] of that tenant's pool (which the rollout
//!   queue's module spells out: its consumer, its acknowledgements, its answers, its inbox).
//! - [`QueueLogin`] is how a connection presents itself: as nobody (an open queue, for a single
//!   user's `train --rollouts`), or with [`Credentials`] and the inbox prefix its permissions
//!   allow. It travels from the server to a worker inside a [`WorkerAccess`], as JSON.

mod authority;
mod error;
mod jwt;

pub use authority::{
    ACCOUNT_KEY, ACCOUNTS_CONF, Credentials, OPERATOR_KEY, Permissions, QueueAuthority, QueueKeys,
    QueueLogin, WorkerAccess,
};
pub use error::QueueAuthError;
