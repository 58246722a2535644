//! Shared code of the fairlock examples.
//!
//! The example programs in this package are thin `main`s over these
//! modules, so that CI can run a small configuration of each one as an
//! integration test (`tests/tests/seckill.rs`, `tests/tests/demo.rs`) and
//! check the same invariants the programs print.

pub mod demo;
pub mod seckill;
