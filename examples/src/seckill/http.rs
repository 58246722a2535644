//! The flash sale as an HTTP service (axum), three ways side by side.
//!
//! | request | answer |
//! |---|---|
//! | `POST /seckill/{item}` | through the item's fairlock: 200 `{"order_id": ...}`, 410 sold out, 429 when the wait for the lock runs out |
//! | `POST /seckill-semaphore/{item}` | through a permit of the item's checkout semaphore, then the Lua script: 200, 410, 429 when the wait for a permit runs out |
//! | `POST /seckill-atomic/{item}` | through one Lua script, no lock: 200 or 410 |
//! | `GET /stock/{item}` | units left and orders, per way, read from Redis |
//! | `GET /stats` | how many answers of each status code each way gave, and the most buyers in checkout at once per item |
//!
//! Every answer has a JSON body with a `status` field (`sold`,
//! `sold_out`, `busy`, `no_such_item`, `bad_item`, `lease_lost`,
//! `error`) and, unless sold, a `message` for a person. An optional
//! `x-buyer` header names the buyer in the order.
//!
//! The three ways keep separate stock for each item (see
//! [`super::Item`]): mixing them on one key would let the script sell
//! between the locked path's read and its write.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use fairlock::{LockClient, LockOptions, MAX_DURATION, MAX_PERMITS};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::checkout::Checkout;
use super::shop::{buy_with_lock, buy_with_semaphore, BuyError, Item, Sale, Shop, Variant};
use super::{env_or, BoxError};

/// The status codes counted one by one; anything else counts as `other`.
const COUNTED: [u16; 7] = [200, 400, 404, 410, 429, 500, 503];

/// The service's settings.
#[derive(Debug, Clone)]
pub struct ServiceConfig {
    /// Units of each item seeded at start, each way (`STOCK`, default 10,000).
    pub stock: i64,
    /// The item ids on sale (`ITEMS`, comma-separated, default `1`).
    pub items: Vec<String>,
    /// How long a request queues for the item's lock or a checkout permit
    /// before it is answered 429 (`WAIT_MS`, default 1,000).
    pub wait_timeout: Duration,
    /// Permits of each item's checkout semaphore: buyers in checkout at
    /// once on the semaphore path (`PERMITS`, default 8).
    pub permits: u32,
    /// A pause under the checkout permit before the sale, standing in for
    /// a rate-limited payment API (`PAYMENT_MS`, default 0).
    pub payment: Duration,
    /// Deadline-aware admission on the lock path (`ADMISSION`, default on).
    pub admission: bool,
    /// Fixed lease of each grant (`LEASE_MS`, default 5,000).
    pub lease: Duration,
}

impl Default for ServiceConfig {
    fn default() -> Self {
        Self {
            stock: 10_000,
            items: vec!["1".to_owned()],
            wait_timeout: Duration::from_secs(1),
            permits: 8,
            payment: Duration::ZERO,
            admission: true,
            lease: Duration::from_secs(5),
        }
    }
}

impl ServiceConfig {
    /// The defaults, overridden by the environment variables named on
    /// each field.
    pub fn from_env() -> Result<Self, String> {
        let d = Self::default();
        let items: String = env_or("ITEMS", d.items.join(","))?;
        Ok(Self {
            stock: env_or("STOCK", d.stock)?,
            items: items
                .split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect(),
            wait_timeout: Duration::from_millis(env_or("WAIT_MS", 1_000)?),
            permits: env_or("PERMITS", d.permits)?,
            payment: Duration::from_millis(env_or("PAYMENT_MS", 0)?),
            admission: env_or("ADMISSION", 1)? != 0,
            lease: Duration::from_millis(env_or("LEASE_MS", 5_000)?),
        })
    }
}

/// Answers counted per status code, for one way of selling.
#[derive(Default)]
struct StatusCounts {
    counted: [AtomicU64; COUNTED.len()],
    other: AtomicU64,
}

impl StatusCounts {
    fn add(&self, status: StatusCode) {
        let slot = COUNTED
            .iter()
            .position(|&code| code == status.as_u16())
            .and_then(|i| self.counted.get(i))
            .unwrap_or(&self.other);
        slot.fetch_add(1, Ordering::Relaxed);
    }

    fn snapshot(&self) -> BTreeMap<String, u64> {
        let mut out: BTreeMap<String, u64> = COUNTED
            .iter()
            .zip(&self.counted)
            .map(|(code, n)| (code.to_string(), n.load(Ordering::Relaxed)))
            .collect();
        out.insert("other".to_owned(), self.other.load(Ordering::Relaxed));
        out
    }
}

struct Inner {
    lock: LockClient,
    shop: Shop,
    config: ServiceConfig,
    items: HashMap<(Variant, String), Item>,
    /// Each item's checkout semaphore and gauge, by item id.
    checkouts: HashMap<String, Checkout>,
    lock_counts: StatusCounts,
    semaphore_counts: StatusCounts,
    atomic_counts: StatusCounts,
}

/// The running service: its Redis connections, items and counters.
/// Cheap to clone.
#[derive(Clone)]
pub struct Service {
    inner: Arc<Inner>,
}

/// One answer before it becomes an HTTP response.
struct Answer {
    status: StatusCode,
    body: Value,
}

impl Answer {
    fn new(status: StatusCode, body: Value) -> Self {
        Self { status, body }
    }

    fn failed(status: StatusCode, kind: &str, item: &str, message: String) -> Self {
        Self::new(
            status,
            json!({ "status": kind, "item": item, "message": message }),
        )
    }
}

impl IntoResponse for Answer {
    fn into_response(self) -> Response {
        if self.status == StatusCode::TOO_MANY_REQUESTS {
            return (self.status, [(header::RETRY_AFTER, "1")], Json(self.body)).into_response();
        }
        (self.status, Json(self.body)).into_response()
    }
}

impl Service {
    /// Connects to the Redis at `url` and puts `config.stock` units of
    /// every item on sale, each way (forgetting earlier orders).
    pub async fn start(url: &str, config: ServiceConfig) -> Result<Self, BoxError> {
        if config.items.is_empty() {
            return Err("ITEMS names no item".into());
        }
        if config.stock < 0 {
            return Err(format!("STOCK={} must not be negative", config.stock).into());
        }
        if config.lease < Duration::from_millis(1) || config.lease > MAX_DURATION {
            return Err("LEASE_MS must be 1..=86400000".into());
        }
        if config.wait_timeout > MAX_DURATION {
            return Err("WAIT_MS must be at most 86400000".into());
        }
        if !(1..=MAX_PERMITS).contains(&config.permits) {
            return Err(format!("PERMITS={} must be 1..={MAX_PERMITS}", config.permits).into());
        }
        if config.payment > MAX_DURATION {
            return Err("PAYMENT_MS must be at most 86400000".into());
        }
        let mut items = HashMap::new();
        for id in &config.items {
            for variant in Variant::ALL {
                items.insert((variant, id.clone()), Item::new(variant, id)?);
            }
        }
        let shop = Shop::connect(url).await?;
        for item in items.values() {
            shop.seed(item, config.stock).await?;
        }
        let lock = LockClient::connect(url).await?;
        let mut checkouts = HashMap::new();
        for ((variant, id), item) in &items {
            if *variant == Variant::Semaphore {
                let semaphore = lock.semaphore(&item.checkout, config.permits)?;
                checkouts.insert(
                    id.clone(),
                    Checkout::new(semaphore).with_payment(config.payment),
                );
            }
        }
        Ok(Self {
            inner: Arc::new(Inner {
                lock,
                shop,
                config,
                items,
                checkouts,
                lock_counts: StatusCounts::default(),
                semaphore_counts: StatusCounts::default(),
                atomic_counts: StatusCounts::default(),
            }),
        })
    }

    /// The routes.
    pub fn router(&self) -> Router {
        Router::new()
            .route("/seckill/{item}", post(seckill_lock))
            .route("/seckill-semaphore/{item}", post(seckill_semaphore))
            .route("/seckill-atomic/{item}", post(seckill_atomic))
            .route("/stock/{item}", get(stock))
            .route("/stats", get(stats))
            .with_state(self.clone())
    }

    /// Serves on `listener` until `shutdown` resolves.
    pub async fn serve(
        &self,
        listener: TcpListener,
        shutdown: impl Future<Output = ()> + Send + 'static,
    ) -> io::Result<()> {
        axum::serve(listener, self.router())
            .with_graceful_shutdown(shutdown)
            .await
    }

    /// Serves on a free port of 127.0.0.1 in the background (for tests);
    /// abort the task to stop it.
    pub async fn spawn_local(&self) -> io::Result<(SocketAddr, JoinHandle<io::Result<()>>)> {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await?;
        let addr = listener.local_addr()?;
        let service = self.clone();
        let task =
            tokio::spawn(async move { service.serve(listener, std::future::pending()).await });
        Ok((addr, task))
    }

    /// Answers given so far each way, by status code.
    pub fn status_counts(&self, variant: Variant) -> BTreeMap<String, u64> {
        self.counts(variant).snapshot()
    }

    /// The most buyers that were in item `id`'s checkout at once since the
    /// service started (semaphore path; `None` for an item not on sale).
    pub fn max_in_checkout(&self, id: &str) -> Option<u64> {
        self.inner.checkouts.get(id).map(|c| c.gauge.max())
    }

    /// Closes the Redis connections.
    pub async fn close(&self) {
        self.inner.lock.shutdown().await;
        self.inner.shop.quit().await;
    }

    fn counts(&self, variant: Variant) -> &StatusCounts {
        match variant {
            Variant::Lock => &self.inner.lock_counts,
            Variant::Semaphore => &self.inner.semaphore_counts,
            Variant::Atomic => &self.inner.atomic_counts,
        }
    }

    async fn buy(&self, variant: Variant, id: &str, headers: &HeaderMap) -> Answer {
        let answer = self.sell(variant, id, headers).await;
        self.counts(variant).add(answer.status);
        answer
    }

    async fn sell(&self, variant: Variant, id: &str, headers: &HeaderMap) -> Answer {
        let Some(item) = self.inner.items.get(&(variant, id.to_owned())) else {
            return unknown_item(variant, id);
        };
        let buyer = headers
            .get("x-buyer")
            .and_then(|v| v.to_str().ok())
            .filter(|b| !b.is_empty() && b.len() <= 64)
            .unwrap_or("anonymous");
        let order_id = uuid::Uuid::new_v4().simple().to_string();
        let (result, waited) = match variant {
            Variant::Lock => {
                // Deadline-aware admission: a buyer whose place in line
                // cannot be served within the wait budget is answered 429
                // at once instead of after the whole budget.
                let options = LockOptions::new()
                    .lease(self.inner.config.lease)
                    .wait_timeout(self.inner.config.wait_timeout)
                    .admission(self.inner.config.admission);
                match buy_with_lock(&self.inner.lock, item, &order_id, buyer, options).await {
                    Ok(purchase) => (Ok(purchase.sale), Some(purchase.waited)),
                    Err(error) => (Err(error), None),
                }
            }
            Variant::Semaphore => {
                let Some(checkout) = self.inner.checkouts.get(id) else {
                    return unknown_item(variant, id);
                };
                // Deadline-aware admission does not apply to semaphores:
                // a buyer waits for a permit up to the whole budget.
                let options = LockOptions::new()
                    .lease(self.inner.config.lease)
                    .wait_timeout(self.inner.config.wait_timeout);
                match buy_with_semaphore(
                    checkout,
                    &self.inner.shop,
                    item,
                    &order_id,
                    buyer,
                    options,
                )
                .await
                {
                    Ok(purchase) => (Ok(purchase.sale), Some(purchase.waited)),
                    Err(error) => (Err(error), None),
                }
            }
            Variant::Atomic => (
                self.inner.shop.buy_atomic(item, &order_id, buyer).await,
                None,
            ),
        };
        match result {
            Ok(Sale::Sold { stock_left }) => {
                let mut body = json!({
                    "status": "sold",
                    "item": id,
                    "order_id": order_id,
                    "stock_left": stock_left,
                });
                if let Some(waited) = waited {
                    body["waited_ms"] = json!(waited.as_millis() as u64);
                }
                Answer::new(StatusCode::OK, body)
            }
            Ok(Sale::SoldOut) => Answer::failed(
                StatusCode::GONE,
                "sold_out",
                id,
                format!("item {id} is sold out"),
            ),
            Ok(Sale::NoSuchItem) => Answer::failed(
                StatusCode::NOT_FOUND,
                "no_such_item",
                id,
                format!("item {id} has no stock in Redis"),
            ),
            Ok(Sale::DuplicateOrder) => Answer::failed(
                StatusCode::INTERNAL_SERVER_ERROR,
                "error",
                id,
                format!("order id {order_id} was already taken; nothing was sold to you"),
            ),
            Err(BuyError::Busy { waited, .. }) => Answer::new(
                StatusCode::TOO_MANY_REQUESTS,
                json!({
                    "status": "busy",
                    "item": id,
                    "waited_ms": waited.as_millis() as u64,
                    "message": format!(
                        "waited {} ms in the queue for item {id} without being served; nothing was sold, retry later",
                        waited.as_millis()
                    ),
                }),
            ),
            Err(error @ BuyError::LeaseLost { .. }) => Answer::failed(
                StatusCode::SERVICE_UNAVAILABLE,
                "lease_lost",
                id,
                format!("{error}; nothing was sold to you, retry"),
            ),
            Err(error) => Answer::failed(
                StatusCode::INTERNAL_SERVER_ERROR,
                "error",
                id,
                error.to_string(),
            ),
        }
    }
}

fn unknown_item(variant: Variant, id: &str) -> Answer {
    match Item::new(variant, id) {
        Err(error) => Answer::failed(StatusCode::BAD_REQUEST, "bad_item", id, error.to_string()),
        Ok(_) => Answer::failed(
            StatusCode::NOT_FOUND,
            "no_such_item",
            id,
            format!("item {id} is not on sale"),
        ),
    }
}

async fn seckill_lock(
    State(service): State<Service>,
    Path(item): Path<String>,
    headers: HeaderMap,
) -> Answer {
    service.buy(Variant::Lock, &item, &headers).await
}

async fn seckill_semaphore(
    State(service): State<Service>,
    Path(item): Path<String>,
    headers: HeaderMap,
) -> Answer {
    service.buy(Variant::Semaphore, &item, &headers).await
}

async fn seckill_atomic(
    State(service): State<Service>,
    Path(item): Path<String>,
    headers: HeaderMap,
) -> Answer {
    service.buy(Variant::Atomic, &item, &headers).await
}

async fn stock(State(service): State<Service>, Path(id): Path<String>) -> Answer {
    let mut body = json!({ "item": id, "initial": service.inner.config.stock });
    for variant in Variant::ALL {
        let Some(item) = service.inner.items.get(&(variant, id.clone())) else {
            return unknown_item(variant, &id);
        };
        match service.inner.shop.level(item).await {
            Ok((stock, orders)) => {
                body[variant.name()] = json!({ "stock": stock, "orders": orders });
            }
            Err(error) => {
                return Answer::failed(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "error",
                    &id,
                    error.to_string(),
                )
            }
        }
    }
    Answer::new(StatusCode::OK, body)
}

async fn stats(State(service): State<Service>) -> Json<Value> {
    let max_in_checkout: BTreeMap<&str, u64> = service
        .inner
        .checkouts
        .iter()
        .map(|(id, checkout)| (id.as_str(), checkout.gauge.max()))
        .collect();
    Json(json!({
        "lock": service.status_counts(Variant::Lock),
        "semaphore": service.status_counts(Variant::Semaphore),
        "atomic": service.status_counts(Variant::Atomic),
        "checkout": {
            "permits": service.inner.config.permits,
            "max_in_checkout": max_in_checkout,
        },
    }))
}
