//! Seckill: a flash sale under real load, with zero oversell.
//!
//! One item, `S` units in Redis, far more buyers than units. Three ways
//! to sell it, side by side, so the numbers can be compared honestly:
//!
//! * **Lock** ([`buy_with_lock`]): a per-item fairlock guards a
//!   multi-step critical section (read the stock, write the new stock,
//!   write the order), each step a fenced write carrying the grant's
//!   fencing token. This is the shape of every sale that must do more
//!   than one thing (reserve a payment, call a warehouse, write a second
//!   store), and the shape that a lock exists for.
//! * **Semaphore** ([`buy_with_semaphore`]): a per-item fair semaphore
//!   with a few permits (8 by default) caps how many buyers are in
//!   checkout at once, as a rate-limited payment API behind the sale
//!   would need; under a permit the atomic script sells. The cap is
//!   checked: [`CheckoutGauge`] records the most buyers in checkout at
//!   once, which must not exceed the permits.
//! * **Atomic** ([`Shop::buy_atomic`]): one Lua script checks and
//!   decrements the stock and writes the order in a single `EVALSHA`, no
//!   lock. When the whole sale is one Redis key update, this beats any
//!   lock, and `docs/SECKILL.md` says so.
//!
//! The modules:
//!
//! * [`shop`]: the item's keys, the three ways to buy, seeding and the audit;
//! * [`checkout`]: the gauge of buyers in checkout at once;
//! * [`swarm`]: many workers on several clients buy concurrently, then
//!   the run is audited against Redis (`examples/seckill.rs`);
//! * [`http`]: the same three ways behind an axum service
//!   (`examples/seckill_http.rs`, loaded by `examples/seckill_load.sh`);
//! * [`line`](mod@line): the HTTP service's own bounded line per item, which
//!   answers 429 before a buyer costs Redis anything;
//! * [`sale_runtime`]: the runtime the service's sales run on, apart
//!   from the one serving HTTP;
//! * [`answer_times`]: the service's own answer times per status code;
//! * [`stats`]: percentiles and Jain's fairness index.

pub mod answer_times;
pub mod checkout;
pub mod http;
pub mod line;
pub mod sale_runtime;
pub mod shop;
pub mod stats;
pub mod swarm;

pub use checkout::{Checkout, CheckoutGauge, CheckoutPass};
pub use shop::{
    buy_with_lock, buy_with_semaphore, sell_one, Audit, BuyError, Item, Purchase, Sale, Shop,
    ShopError, Step, Variant,
};
pub use swarm::{print_comparison, Check, Report, SwarmConfig};

/// The error type of the runners: whatever stopped them, as text.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The environment variable `name` parsed as a `T`, or `default` when it
/// is unset or empty.
pub fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Ok(value) if !value.trim().is_empty() => value
            .trim()
            .parse()
            .map_err(|_| format!("{name}={value:?} is not a valid value")),
        _ => Ok(default),
    }
}
