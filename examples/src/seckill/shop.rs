//! One item on sale: its keys in Redis, the two ways to buy a unit, and
//! the audit that proves nothing was oversold.
//!
//! The lock path is written the way fairlock recommends for any resource
//! held in Redis: every read and write of the critical section is a fenced
//! call carrying the grant's fencing token, so a holder that was paused
//! past its lease cannot act on a stale read after a newer holder started.
//!
//! The semaphore path caps how many buyers are in checkout at once (a
//! per-item fair semaphore) and sells under a permit with the atomic
//! script, so the cap needs no fencing: the script alone keeps the stock
//! right, the permit only limits concurrency.

use std::collections::HashMap;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use fairlock::{Error as LockError, FencedOp, FencingToken, LockClient, LockOptions, Reply};
use fred::prelude::{
    Builder, Client, ClientLike, Config, Error as FredError, HashesInterface, KeysInterface,
    LuaInterface, ReconnectPolicy,
};

use super::checkout::Checkout;

/// Limit for connecting to Redis and for every data command.
const REDIS_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest item id accepted (ids end up in key and lock names).
pub const MAX_ITEM_ID_BYTES: usize = 64;

/// The lock-free sale, see the header of `atomic_buy.lua`.
const ATOMIC_BUY: &str = include_str!("atomic_buy.lua");
static ATOMIC_BUY_SHA1: LazyLock<String> =
    LazyLock::new(|| sha1_smol::Sha1::from(ATOMIC_BUY).digest().to_string());

/// The ways to sell, kept in separate keys so they never share stock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Variant {
    /// A per-item fairlock around a multi-step critical section.
    Lock,
    /// A per-item fair semaphore caps the buyers in checkout; under a
    /// permit, the atomic script sells.
    Semaphore,
    /// One Lua script, no lock.
    Atomic,
}

impl Variant {
    /// Every variant: lock, semaphore, atomic.
    pub const ALL: [Variant; 3] = [Variant::Lock, Variant::Semaphore, Variant::Atomic];

    /// `lock`, `semaphore` or `atomic`.
    pub fn name(self) -> &'static str {
        match self {
            Variant::Lock => "lock",
            Variant::Semaphore => "semaphore",
            Variant::Atomic => "atomic",
        }
    }

    /// Whether a buyer of this variant waits in a fairlock queue (and can
    /// be answered "busy" when the wait runs out).
    pub fn queues(self) -> bool {
        matches!(self, Variant::Lock | Variant::Semaphore)
    }
}

/// The Redis keys of one item sold one way. All share one hash tag, so
/// the fenced calls and the script run on Redis Cluster too.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// The item id, as in `POST /seckill/{id}`.
    pub id: String,
    /// Which way it is sold.
    pub variant: Variant,
    /// The per-item lock's name, `item:<id>` (used by [`Variant::Lock`]).
    pub lock: String,
    /// The per-item semaphore's name, `checkout:<id>` (used by
    /// [`Variant::Semaphore`]).
    pub checkout: String,
    /// String: units left.
    pub stock: String,
    /// Hash: order id -> buyer.
    pub orders: String,
    /// String: the newest fencing token that touched the item.
    pub fence: String,
}

impl Item {
    /// The keys of item `id` sold the `variant` way. Refuses ids that are
    /// empty, longer than [`MAX_ITEM_ID_BYTES`], or not made of ASCII
    /// letters, digits, `-`, `_` and `.`.
    pub fn new(variant: Variant, id: &str) -> Result<Self, ShopError> {
        let valid = !id.is_empty()
            && id.len() <= MAX_ITEM_ID_BYTES
            && id
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !valid {
            return Err(ShopError::BadItem(id.to_owned()));
        }
        let tag = format!("seckill:{{{}:{id}}}", variant.name());
        Ok(Self {
            id: id.to_owned(),
            variant,
            lock: format!("item:{id}"),
            checkout: format!("checkout:{id}"),
            stock: format!("{tag}:stock"),
            orders: format!("{tag}:orders"),
            fence: format!("{tag}:fence"),
        })
    }
}

/// How one purchase attempt ended, when it got to the stock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sale {
    /// A unit was sold; `stock_left` units remain.
    Sold {
        /// Units left after this sale.
        stock_left: i64,
    },
    /// No unit left; nothing changed.
    SoldOut,
    /// The item's stock key does not exist; nothing changed.
    NoSuchItem,
    /// The order id was taken already. The atomic path changed nothing;
    /// the lock path had written the stock (the audit then reports it).
    /// Order ids are unique per attempt, so this means a bug.
    DuplicateOrder,
}

/// A purchase through the lock or the semaphore path.
#[derive(Debug)]
pub struct Purchase {
    /// What happened to the stock.
    pub sale: Sale,
    /// How long the buyer queued for the item's lock or permit.
    pub waited: Duration,
    /// How long the buyer held the lock or permit: from the grant until
    /// its release returned.
    pub held: Duration,
    /// Releasing the lock or permit failed, e.g. [`LockError::NotOwner`] when the
    /// lease had run out by then. The sale above stands either way: each
    /// of its writes was accepted under a token no newer holder had used.
    pub release_error: Option<LockError>,
}

/// Which step of the locked sale a stale fencing token stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Reading the stock: nothing changed.
    ReadStock,
    /// Writing the new stock: nothing changed.
    WriteStock,
    /// Writing the order after the stock was written: one unit is gone
    /// from the stock without an order (undersold, never oversold).
    WriteOrder,
}

/// Why a purchase attempt did not get an answer from the stock.
#[derive(Debug, thiserror::Error)]
pub enum BuyError {
    /// The wait for the item's lock or checkout permit ran out; nothing
    /// was sold.
    #[error("waited {waited:?} in the queue for item {item} without being served; retry later")]
    Busy {
        /// The item.
        item: String,
        /// How long the buyer waited.
        waited: Duration,
    },
    /// A fenced call was refused: this holder's lease ran out and a newer
    /// holder has touched the item since.
    #[error(
        "the lease on item {item}'s lock ran out during the sale ({step:?} refused: {source})"
    )]
    LeaseLost {
        /// The item.
        item: String,
        /// The step refused.
        step: Step,
        /// The refusal ([`LockError::StaleToken`]).
        source: LockError,
    },
    /// Any other fairlock error.
    #[error("lock or semaphore of item {item}: {source}")]
    Lock {
        /// The item.
        item: String,
        /// The error.
        source: LockError,
    },
    /// A data command failed.
    #[error(transparent)]
    Shop(#[from] ShopError),
}

/// Errors of the data side (fred) and of bad input.
#[derive(Debug, thiserror::Error)]
pub enum ShopError {
    /// The item id was refused; Redis was not touched.
    #[error("invalid item id {0:?}: use 1 to 64 ASCII letters, digits, '-', '_' or '.'")]
    BadItem(String),
    /// Redis could not be reached.
    #[error("cannot connect to Redis at {url}: {reason}")]
    Connect {
        /// The URL.
        url: String,
        /// What failed.
        reason: String,
    },
    /// A data command failed; fred's error is the source.
    #[error("Redis failed while {during}: {source}; check that Redis is up and retry")]
    Redis {
        /// What was being done.
        during: &'static str,
        /// fred's error.
        #[source]
        source: FredError,
    },
    /// A reply had an unexpected shape.
    #[error("unexpected reply while {during}: {reply}")]
    Reply {
        /// What was being done.
        during: &'static str,
        /// The reply.
        reply: String,
    },
}

/// What Redis holds for an item after a run.
#[derive(Debug, Clone, Default)]
pub struct Audit {
    /// Units left (`None`: the stock key is missing).
    pub stock: Option<i64>,
    /// Every order: order id -> buyer.
    pub orders: HashMap<String, String>,
}

/// A plain fred connection for the item data: seeding, the atomic
/// script, and the audit. Cheap to clone (one pipelined connection).
#[derive(Clone)]
pub struct Shop {
    data: Client,
}

impl Shop {
    /// Connects within 5 s; reconnects by itself afterwards.
    pub async fn connect(url: &str) -> Result<Self, ShopError> {
        let connect_error = |reason: String| ShopError::Connect {
            url: url.to_owned(),
            reason,
        };
        let config = Config::from_url(url).map_err(|e| connect_error(e.details().to_owned()))?;
        let mut builder = Builder::from_config(config);
        builder
            .with_connection_config(|c| {
                c.connection_timeout = REDIS_TIMEOUT;
                c.internal_command_timeout = REDIS_TIMEOUT;
            })
            .with_performance_config(|p| p.default_command_timeout = REDIS_TIMEOUT)
            .set_policy(ReconnectPolicy::new_exponential(0, 50, 2_000, 2));
        let data = builder
            .build()
            .map_err(|e| connect_error(e.details().to_owned()))?;
        match tokio::time::timeout(REDIS_TIMEOUT, data.init()).await {
            Ok(Ok(_)) => Ok(Self { data }),
            Ok(Err(e)) => Err(connect_error(e.details().to_owned())),
            Err(_) => Err(connect_error(format!("no answer within {REDIS_TIMEOUT:?}"))),
        }
    }

    /// Closes the connection.
    pub async fn quit(&self) {
        let _ = tokio::time::timeout(REDIS_TIMEOUT, self.data.quit()).await;
    }

    /// Puts `stock` units of `item` on sale, forgetting earlier orders.
    pub async fn seed(&self, item: &Item, stock: i64) -> Result<(), ShopError> {
        self.data
            .del::<(), _>(vec![item.orders.as_str(), item.fence.as_str()])
            .await
            .map_err(redis_error("seeding the stock"))?;
        self.data
            .set::<(), _, _>(item.stock.as_str(), stock, None, None, false)
            .await
            .map_err(redis_error("seeding the stock"))
    }

    /// Units left and the number of orders (`HLEN`), for a status page.
    pub async fn level(&self, item: &Item) -> Result<(Option<i64>, u64), ShopError> {
        let stock = self
            .data
            .get::<Option<i64>, _>(item.stock.as_str())
            .await
            .map_err(redis_error("reading the stock"))?;
        let orders = self
            .data
            .hlen::<u64, _>(item.orders.as_str())
            .await
            .map_err(redis_error("counting the orders"))?;
        Ok((stock, orders))
    }

    /// The stock and every order, to check a run against.
    pub async fn audit(&self, item: &Item) -> Result<Audit, ShopError> {
        let stock = self
            .data
            .get::<Option<i64>, _>(item.stock.as_str())
            .await
            .map_err(redis_error("auditing the stock"))?;
        let orders = self
            .data
            .hgetall::<HashMap<String, String>, _>(item.orders.as_str())
            .await
            .map_err(redis_error("auditing the orders"))?;
        Ok(Audit { stock, orders })
    }

    /// Buys one unit with the lock-free script (`atomic_buy.lua`).
    pub async fn buy_atomic(
        &self,
        item: &Item,
        order_id: &str,
        buyer: &str,
    ) -> Result<Sale, BuyError> {
        let keys = vec![item.stock.as_str(), item.orders.as_str()];
        let args = vec![order_id, buyer];
        let sha1 = ATOMIC_BUY_SHA1.as_str();
        let reply = match self
            .data
            .evalsha::<i64, _, _, _>(sha1, keys.clone(), args.clone())
            .await
        {
            // After a restart or SCRIPT FLUSH, or on a cluster node that
            // never saw the script: EVAL sends the source to the node that
            // owns the item's slot, which caches it for the next EVALSHA
            // (SCRIPT LOAD could go to another node).
            Err(e) if e.details().starts_with("NOSCRIPT") => {
                self.data.eval::<i64, _, _, _>(ATOMIC_BUY, keys, args).await
            }
            other => other,
        }
        .map_err(redis_error("running atomic_buy.lua"))?;
        Ok(match reply {
            left if left >= 0 => Sale::Sold { stock_left: left },
            -1 => Sale::SoldOut,
            -2 => Sale::NoSuchItem,
            -3 => Sale::DuplicateOrder,
            other => {
                return Err(ShopError::Reply {
                    during: "running atomic_buy.lua",
                    reply: other.to_string(),
                }
                .into())
            }
        })
    }
}

/// Buys one unit under the item's fairlock: waits in the FIFO queue
/// (at most the wait timeout in `options`), then, holding the lock,
/// reads the stock and writes the new stock and the order, each a
/// fenced call carrying the grant's token, and releases.
pub async fn buy_with_lock(
    lock: &LockClient,
    item: &Item,
    order_id: &str,
    buyer: &str,
    options: LockOptions,
) -> Result<Purchase, BuyError> {
    let asked = Instant::now();
    let guard = match lock.lock_with(&item.lock, options).await {
        Ok(guard) => guard,
        Err(LockError::WaitTimeout { waited, .. }) => {
            return Err(BuyError::Busy {
                item: item.id.clone(),
                waited,
            })
        }
        Err(LockError::WouldMissDeadline { .. }) => {
            let waited = asked.elapsed();
            return Err(BuyError::Busy {
                item: item.id.clone(),
                waited,
            });
        }
        Err(source) => {
            return Err(BuyError::Lock {
                item: item.id.clone(),
                source,
            })
        }
    };
    let waited = asked.elapsed();
    let sale = sell_one(lock, guard.token(), item, order_id, buyer).await;
    // Release whatever happened: the next buyer in line is granted the
    // lock by this very call.
    let released = guard.release().await;
    Ok(Purchase {
        sale: sale?,
        waited,
        held: asked.elapsed().saturating_sub(waited),
        release_error: released.err(),
    })
}

/// Buys one unit under a permit of the item's checkout semaphore: waits
/// in its FIFO queue (at most the wait timeout in `options`), then,
/// holding a permit and counted in the checkout's gauge, pauses for the
/// stand-in payment call (if any), runs the atomic script
/// ([`Shop::buy_atomic`]), and gives the permit back.
///
/// The permit only caps how many buyers are in checkout at once; the
/// stock is kept right by the script, so a permit whose lease ran out
/// (reported in [`Purchase::release_error`]) cannot oversell.
pub async fn buy_with_semaphore(
    checkout: &Checkout,
    shop: &Shop,
    item: &Item,
    order_id: &str,
    buyer: &str,
    options: LockOptions,
) -> Result<Purchase, BuyError> {
    let asked = Instant::now();
    let permit = match checkout.semaphore.acquire_with(options).await {
        Ok(permit) => permit,
        Err(LockError::WaitTimeout { waited, .. }) => {
            return Err(BuyError::Busy {
                item: item.id.clone(),
                waited,
            })
        }
        Err(source) => {
            return Err(BuyError::Lock {
                item: item.id.clone(),
                source,
            })
        }
    };
    let waited = asked.elapsed();
    let sale = {
        // In checkout from the grant until just before the release, so
        // the gauge never counts a buyer whose permit is already back.
        let _in_checkout = checkout.gauge.enter();
        if !checkout.payment.is_zero() {
            tokio::time::sleep(checkout.payment).await;
        }
        shop.buy_atomic(item, order_id, buyer).await
    };
    let released = permit.release().await;
    Ok(Purchase {
        sale: sale?,
        waited,
        held: asked.elapsed().saturating_sub(waited),
        release_error: released.err(),
    })
}

/// The critical section of the lock path alone, for a caller that holds
/// the item's lock itself: `token` is its guard's fencing token. Every
/// step is refused with [`BuyError::LeaseLost`] once a newer holder has
/// touched the item.
pub async fn sell_one(
    lock: &LockClient,
    token: FencingToken,
    item: &Item,
    order_id: &str,
    buyer: &str,
) -> Result<Sale, BuyError> {
    let fenced = |step: Step| {
        move |source: LockError| match source {
            LockError::StaleToken { .. } => BuyError::LeaseLost {
                item: item.id.clone(),
                step,
                source,
            },
            source => BuyError::Lock {
                item: item.id.clone(),
                source,
            },
        }
    };
    let read = lock
        // A fenced read: it records this holder's token in the item's fence
        // first. Fencing only the writes is not enough for a read-modify-
        // write: a holder whose lease ran out could still write a value
        // computed from a read that a newer holder has since superseded.
        .fenced_write(&item.fence, &item.stock, token, FencedOp::Get)
        .await
        .map_err(fenced(Step::ReadStock))?;
    let stock = match read {
        Reply::Nil => return Ok(Sale::NoSuchItem),
        Reply::Int(n) => n,
        Reply::Str(text) => text.parse::<i64>().map_err(|_| ShopError::Reply {
            during: "reading the stock",
            reply: text.clone(),
        })?,
        other => {
            return Err(ShopError::Reply {
                during: "reading the stock",
                reply: format!("{other:?}"),
            }
            .into())
        }
    };
    if stock <= 0 {
        return Ok(Sale::SoldOut);
    }
    // A plain read-modify-write: correct only because the lock admits one
    // buyer at a time and the fence refuses a holder that outlived it.
    // The stock is written before the order: if the lease is lost between
    // the two, a unit goes unsold instead of being sold twice.
    let stock_left = stock - 1;
    lock.fenced_write(
        &item.fence,
        &item.stock,
        token,
        FencedOp::set(&stock_left.to_string()),
    )
    .await
    .map_err(fenced(Step::WriteStock))?;
    let created = lock
        .fenced_write(
            &item.fence,
            &item.orders,
            token,
            FencedOp::hset(order_id, buyer),
        )
        .await
        .map_err(fenced(Step::WriteOrder))?;
    Ok(match created {
        Reply::Int(1) => Sale::Sold { stock_left },
        _ => Sale::DuplicateOrder,
    })
}

fn redis_error(during: &'static str) -> impl Fn(FredError) -> ShopError {
    move |source| ShopError::Redis { during, source }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn item_keys_share_one_hash_tag_per_variant() {
        let item = Item::new(Variant::Lock, "sku-42").expect("valid id");
        assert_eq!(item.lock, "item:sku-42");
        assert_eq!(item.stock, "seckill:{lock:sku-42}:stock");
        assert_eq!(item.fence, "seckill:{lock:sku-42}:fence");
        let atomic = Item::new(Variant::Atomic, "sku-42").expect("valid id");
        assert_ne!(atomic.stock, item.stock);
        let semaphore = Item::new(Variant::Semaphore, "sku-42").expect("valid id");
        assert_eq!(semaphore.stock, "seckill:{semaphore:sku-42}:stock");
        assert_eq!(semaphore.orders, "seckill:{semaphore:sku-42}:orders");
        assert_eq!(semaphore.checkout, "checkout:sku-42");
        for other in [&item, &atomic] {
            assert_ne!(semaphore.stock, other.stock);
            assert_ne!(semaphore.orders, other.orders);
        }
    }

    #[test]
    fn bad_item_ids_are_refused() {
        for id in ["", "a b", "x{y}", &"z".repeat(MAX_ITEM_ID_BYTES + 1)] {
            assert!(Item::new(Variant::Lock, id).is_err(), "{id:?}");
        }
    }
}
