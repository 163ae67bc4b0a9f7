//! Reinforcement learning on the engines: player transcripts kept token-in, token-out, their
//! conversion to masked training datums, and the advantage estimators. (Rollouts and the job
//! driver build on these.)

pub mod advantage;
mod context;
pub mod datum;
mod diagnosis;
pub mod driver;
mod group_stream;
pub mod job;
pub mod metrics;
pub mod render;
pub mod report;
pub mod rollout;
pub mod run_folder;
pub mod sft;
mod train_step;
mod training_loop;
pub mod transcript;
pub mod watch;

pub use advantage::{Estimator, GroupReturns, advantages, fold_kl};
pub use datum::{rl_datum, sft_datum};
pub use transcript::{Span, SpanKind, TokenSequence, Transcript};
