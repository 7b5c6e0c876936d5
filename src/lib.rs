#![doc = include_str!("../README.md")]
//! # safetensors-staging
//!
//! Loads Hugging Face safetensors checkpoints onto a device with bounded memory and exact bytes.
//! This facade re-exports [`staging_core`] (traits, policy, stager, host backend) and, behind the
//! `mock` feature, [`backend_mock`] (fault-injecting doubles, fixtures, the conformance suite).
//! See the README for the `stage` command and the policy.

pub use staging_core::*;

/// The core crate, by name.
pub use staging_core as core;

/// Fault-injecting doubles, fixture writers and the backend conformance suite.
#[cfg(feature = "mock")]
pub use backend_mock as mock;

/// NVIDIA cuFile (GDS, compatibility mode) and POSIX backends for CUDA devices.
#[cfg(feature = "cufile")]
pub use backend_cufile as cufile;

/// AMD hipFile backend for HIP devices (run against stubs only so far).
#[cfg(feature = "hipfile")]
pub use backend_hipfile as hipfile;
