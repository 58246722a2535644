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
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use fairlock::{LockClient, LockOptions, MAX_DURATION, MAX_PERMITS};
use serde_json::{json, Value};
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinHandle;

use super::answer_times::AnswerTimes;
use super::checkout::Checkout;
use super::line::{Line, LineFull};
use super::sale_runtime::SaleRuntime;
use super::shop::{
    buy_with_lock, buy_with_semaphore, BuyError, Item, Purchase, Sale, Shop, Variant,
};
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
    /// The service's own line per item in front of the lock and the
    /// semaphore (`LINE`, default on): a buyer who arrives when more are
    /// in line than the wait budget can serve is answered 429 at once,
    /// without a Redis call (see [`Line`]).
    pub line: bool,
    /// A fixed size for that line instead of the adaptive one
    /// (`MAX_IN_LINE`, default 0: adaptive).
    pub max_in_line: u64,
    /// Worker threads of the runtime the sales run on, apart from the
    /// HTTP runtime (`SALE_THREADS`, default 2; 0 runs the sales on the
    /// HTTP runtime's tasks, see [`SaleRuntime`]).
    pub sale_threads: usize,
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
            line: true,
            max_in_line: 0,
            sale_threads: 2,
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
            line: env_or("LINE", 1)? != 0,
            max_in_line: env_or("MAX_IN_LINE", d.max_in_line)?,
            sale_threads: env_or("SALE_THREADS", d.sale_threads)?,
        })
    }
}

/// Answers counted and timed per status code, for one way of selling.
#[derive(Default)]
struct StatusCounts {
    counted: [AtomicU64; COUNTED.len()],
    other: AtomicU64,
    times: AnswerTimes,
}

impl StatusCounts {
    fn add(&self, status: StatusCode, took: Duration) {
        self.times.record(status.as_u16(), took);
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
    /// The service's line in front of each item's lock and semaphore
    /// (when `config.line`).
    lines: HashMap<(Variant, String), Arc<Line>>,
    lock_counts: StatusCounts,
    semaphore_counts: StatusCounts,
    atomic_counts: StatusCounts,
    /// The runtime the sales run on (none: the HTTP runtime). Declared
    /// last, so it is dropped after the clients whose tasks it runs.
    sales: Option<SaleRuntime>,
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
        // The clients connect on the sale runtime, so their socket tasks
        // (and the tasks their replies wake) run there.
        let sales = match config.sale_threads {
            0 => None,
            threads => Some(SaleRuntime::start(threads)?),
        };
        let connect = {
            let url = url.to_owned();
            async move {
                let shop = Shop::connect(&url).await?;
                let lock = LockClient::connect(&url).await?;
                Ok::<_, BoxError>((shop, lock))
            }
        };
        let (shop, lock) = match &sales {
            Some(sales) => sales.run(connect).await??,
            None => connect.await?,
        };
        for item in items.values() {
            shop.seed(item, config.stock).await?;
        }
        let mut lines = HashMap::new();
        if config.line {
            let line = |parallel| match config.max_in_line {
                0 => Arc::new(Line::new(config.wait_timeout, parallel)),
                fixed => Arc::new(Line::fixed(fixed)),
            };
            for id in &config.items {
                lines.insert((Variant::Lock, id.clone()), line(1));
                lines.insert((Variant::Semaphore, id.clone()), line(config.permits));
            }
        }
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
                lines,
                lock_counts: StatusCounts::default(),
                semaphore_counts: StatusCounts::default(),
                atomic_counts: StatusCounts::default(),
                sales,
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
            .route("/answer-times/{way}", get(answer_times))
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
    /// Its accept queue is as deep as the service's own (see [`listen`]).
    pub async fn spawn_local(&self) -> io::Result<(SocketAddr, JoinHandle<io::Result<()>>)> {
        let listener = listen(0)?;
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

    /// Teaches the item's line how long this buyer held the lock or permit;
    /// the sale and the wait, for the answer.
    fn served(
        &self,
        variant: Variant,
        id: &str,
        purchase: Result<Purchase, BuyError>,
    ) -> (Result<Sale, BuyError>, Option<Duration>) {
        match purchase {
            Ok(purchase) => {
                if let Some(line) = self.line(variant, id) {
                    line.served(purchase.held);
                }
                (Ok(purchase.sale), Some(purchase.waited))
            }
            Err(error) => (Err(error), None),
        }
    }

    /// The item's line for `variant`, if the service keeps one.
    fn line(&self, variant: Variant, id: &str) -> Option<&Arc<Line>> {
        self.inner.lines.get(&(variant, id.to_owned()))
    }

    async fn buy(&self, variant: Variant, id: String, headers: &HeaderMap) -> Answer {
        let started = Instant::now();
        let buyer = headers
            .get("x-buyer")
            .and_then(|v| v.to_str().ok())
            .filter(|b| !b.is_empty() && b.len() <= 64)
            .unwrap_or("anonymous")
            .to_owned();
        // The service's own line, checked here on the HTTP task: a buyer
        // turned away costs Redis nothing and the sale runtime nothing.
        let place = match self.line(variant, &id).map(Line::join) {
            Some(Err(full)) => {
                let answer = line_full(&id, full);
                self.counts(variant).add(answer.status, started.elapsed());
                return answer;
            }
            Some(Ok(place)) => Some(place),
            None => None,
        };
        let service = self.clone();
        let item = id.clone();
        // The count is part of the sale, so a sale whose buyer hung up (the
        // HTTP task dropped) is counted when it completes all the same.
        let sale = async move {
            let answer = service.sell(variant, &item, &buyer).await;
            drop(place);
            service
                .counts(variant)
                .add(answer.status, started.elapsed());
            answer
        };
        // Sales that hold a lock or a permit across their round trips run
        // on the sale runtime; the atomic script holds nothing and runs
        // on this one, in a task of its own as well.
        let sales = self
            .inner
            .sales
            .as_ref()
            .filter(|_| variant != Variant::Atomic);
        let finished = match sales {
            Some(sales) => sales.run(sale).await,
            None => tokio::spawn(sale).await.map_err(BoxError::from),
        };
        finished.unwrap_or_else(|error| {
            let answer = Answer::failed(
                StatusCode::INTERNAL_SERVER_ERROR,
                "error",
                &id,
                format!("the sale did not finish: {error}"),
            );
            self.counts(variant).add(answer.status, started.elapsed());
            answer
        })
    }

    async fn sell(&self, variant: Variant, id: &str, buyer: &str) -> Answer {
        let Some(item) = self.inner.items.get(&(variant, id.to_owned())) else {
            return unknown_item(variant, id);
        };
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
                let purchase =
                    buy_with_lock(&self.inner.lock, item, &order_id, buyer, options).await;
                self.served(variant, id, purchase)
            }
            Variant::Semaphore => {
                let Some(checkout) = self.inner.checkouts.get(id) else {
                    return unknown_item(variant, id);
                };
                // Without deadline-aware admission (which permits support
                // too): a buyer waits for a permit up to the whole budget,
                // as in the runs the README reports for this variant.
                let options = LockOptions::new()
                    .lease(self.inner.config.lease)
                    .wait_timeout(self.inner.config.wait_timeout);
                let purchase =
                    buy_with_semaphore(checkout, &self.inner.shop, item, &order_id, buyer, options)
                        .await;
                self.served(variant, id, purchase)
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

/// 429 from the service's own line: nothing was asked of Redis.
fn line_full(id: &str, full: LineFull) -> Answer {
    Answer::new(
        StatusCode::TOO_MANY_REQUESTS,
        json!({
            "status": "busy",
            "item": id,
            "waited_ms": 0,
            "message": format!(
                "{} buyers are already in line for item {id}, as many as can be served within the wait budget; nothing was sold, retry later",
                full.in_line
            ),
        }),
    )
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
    service.buy(Variant::Lock, item, &headers).await
}

async fn seckill_semaphore(
    State(service): State<Service>,
    Path(item): Path<String>,
    headers: HeaderMap,
) -> Answer {
    service.buy(Variant::Semaphore, item, &headers).await
}

async fn seckill_atomic(
    State(service): State<Service>,
    Path(item): Path<String>,
    headers: HeaderMap,
) -> Answer {
    service.buy(Variant::Atomic, item, &headers).await
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

/// The service's answer times for one way (`lock`, `semaphore`,
/// `atomic`), one line per status code, as plain text for the load script:
/// `429 n=19000 p50=0.21 p99=3.10 max=12.00` (milliseconds).
async fn answer_times(State(service): State<Service>, Path(way): Path<String>) -> Response {
    let Some(variant) = Variant::ALL.into_iter().find(|v| v.name() == way) else {
        return (StatusCode::NOT_FOUND, format!("no way named {way:?}\n")).into_response();
    };
    let summary = service.counts(variant).times.summary();
    let mut text = String::new();
    if let Value::Object(by_status) = summary {
        for (status, t) in by_status {
            text.push_str(&format!(
                "{status} n={} p50={} p99={} max={}\n",
                t["n"], t["p50"], t["p99"], t["max"]
            ));
        }
    }
    text.into_response()
}

async fn stats(State(service): State<Service>) -> Json<Value> {
    let max_in_checkout: BTreeMap<&str, u64> = service
        .inner
        .checkouts
        .iter()
        .map(|(id, checkout)| (id.as_str(), checkout.gauge.max()))
        .collect();
    let lines: BTreeMap<String, Value> = service
        .inner
        .lines
        .iter()
        .map(|((variant, id), line)| {
            (
                format!("{}:{id}", variant.name()),
                json!({
                    "capacity": line.capacity(),
                    "pass_ms": line.pass().as_secs_f64() * 1000.0,
                    "most": line.most(),
                    "shed": line.shed(),
                }),
            )
        })
        .collect();
    // serde_json sorts the keys; the load script's greps rely on "lock",
    // "semaphore" and "atomic" appearing at the top level before
    // "service_ms", which has the same names inside.
    Json(json!({
        "lock": service.status_counts(Variant::Lock),
        "semaphore": service.status_counts(Variant::Semaphore),
        "atomic": service.status_counts(Variant::Atomic),
        "checkout": {
            "permits": service.inner.config.permits,
            "max_in_checkout": max_in_checkout,
        },
        "line": lines,
        "service_ms": {
            "lock": service.inner.lock_counts.times.summary(),
            "semaphore": service.inner.semaphore_counts.times.summary(),
            "atomic": service.inner.atomic_counts.times.summary(),
        },
    }))
}

/// Listens on 127.0.0.1:`port` (0: any free port) with the deepest accept
/// queue the kernel allows (it caps the backlog at `net.core.somaxconn`):
/// a flash sale opens thousands of connections at once, and a full queue
/// drops SYNs that the clients only retry a whole second later, or, with
/// SYN cookies, can reset them. `TcpListener::bind` asks for 128: `ab -c
/// 500` against the test service filled it, the kernel logged "Possible
/// SYN flooding" on its port and two requests failed (CI, 2026-11-29).
pub fn listen(port: u16) -> io::Result<TcpListener> {
    let socket = TcpSocket::new_v4()?;
    socket.set_reuseaddr(true)?;
    socket.bind(SocketAddr::from((Ipv4Addr::LOCALHOST, port)))?;
    socket.listen(65535)
}
