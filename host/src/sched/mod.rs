//! The scheduler: the loops that drive the step-level engines for every job that uses a loaded
//! base model. (Now the sampling loop; training steps are driven by the job itself.)

pub mod sampler;

pub use sampler::SamplerService;
