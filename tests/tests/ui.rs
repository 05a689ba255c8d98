//! The status page (`/ui` on the metrics listener) in a real browser:
//! headless Chromium opens the page of a 3-node cluster running a job of
//! 1,024 tasks, one in ERROR and a barrier one task short, and the page
//! shows the missing task by name, the ERROR cell, the counts; the 404s of
//! what does not exist; and strings users chose (job names, error
//! messages, barrier ids, keys) holding markup shown as text. Screenshots
//! go to `target/ui-screenshots/`.

use std::sync::Arc;
use std::time::Duration;

use coordstore_tests::browser::{self, section, text};
use coordstore_tests::job::XlaJob;
use coordstore_tests::wait::{eventually, holds};
use coordstore_tests::{connect, http_get, ns, workspace, Cluster};
use proto::coordstore::{BarriersRequest, NamespaceSettings};

const WAIT: Duration = Duration::from_secs(90);
const TASKS: i32 = 1024;
const NS: &str = "train-42";
const BARRIER: &str = "step_1000";

/// Markup that would run or show as markup if a page put it in as HTML.
const IMG: &str = "<img src=x onerror=\"document.title='pwned'\">";
const BOLD: &str = "</script><b id=\"injected\">bold</b>";

fn screenshot_path(name: &str) -> std::path::PathBuf {
    workspace().join("target/ui-screenshots").join(name)
}

/// Waits until the barrier of `ns` holds `arrived` arrivals, as node
/// `addr` reports it.
async fn wait_arrivals(addr: &str, ns_name: &str, id: &str, arrived: u64) {
    let (addr, ns_name, id) = (addr.to_string(), ns_name.to_string(), id.to_string());
    eventually(
        format!("{arrived} arrivals at barrier {id}"),
        WAIT,
        move || {
            let (addr, ns_name, id) = (addr.clone(), ns_name.clone(), id.clone());
            async move {
                let mut c = connect(&addr, WAIT).await;
                let req = BarriersRequest {
                    id,
                    missing_limit: 0,
                };
                let got = c.barriers(ns::request(&ns_name, req)).await;
                let n = got.map(|r| r.into_inner().barriers.first().map(|b| b.arrived));
                holds(matches!(n, Ok(Some(a)) if a == arrived), || n)
            }
        },
    )
    .await;
}

/// The DOM of `url` once `shown` holds of it (the page refreshes itself:
/// the browser looks again until it does).
async fn dom_showing(url: &str, what: &str, shown: impl Fn(&str) -> bool + Send + Sync) -> String {
    let shown = Arc::new(shown);
    let url = url.to_string();
    eventually(format!("{url} to show {what}"), WAIT, move || {
        let (url, shown) = (url.clone(), shown.clone());
        async move {
            let dom = browser::dom(&url).await;
            holds(shown(&dom), || text(&dom))?;
            Ok::<_, String>(dom)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_page_shows_why_a_job_of_1024_tasks_is_stuck() {
    let http = coordstore_tests::free_addrs(3);
    let h = http.clone();
    let cluster = Cluster::start_each(3, &[], move |i| {
        vec!["--metrics-listen".into(), h[i].clone()]
    });
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    // The page of a follower: what only the leader knows comes from it.
    let f = (leader + 1) % 3;
    let addr = cluster.nodes[f].addr.clone();
    let settings = NamespaceSettings {
        tasks: TASKS as u32,
        recoverable: true,
        heartbeat_timeout_ms: Some(3_600_000),
        ..Default::default()
    };
    ns::create(&addr, NS, settings).await.expect("create");
    let job = XlaJob::register(&addr, NS, TASKS).await;
    job.report_error(5, "out of memory on TPU 0").await;
    // Every task but 5 takes part; all of them but 17 arrive.
    let of: Vec<i32> = (0..TASKS).filter(|&t| t != 5).collect();
    let _parked = job.arrive(
        BARRIER,
        of.iter().copied().filter(|&t| t != 17),
        &of,
        Duration::from_secs(3600),
    );
    wait_arrivals(&addr, NS, BARRIER, 1022).await;

    let url = format!("http://{}/ui/ns/{NS}", http[f]);
    let dom = dom_showing(&url, "the barrier waiting for task 17", |d| {
        section(d, "barriers").is_some_and(|b| b.contains("/job:jax_worker/replica:0/task:17"))
    })
    .await;
    let barriers = text(section(&dom, "barriers").expect("the barriers section"));
    for want in [
        BARRIER,
        "arrived 1,022 of 1,023",
        "Missing 1:",
        "/job:jax_worker/replica:0/task:17",
        "CONNECTED",
        "waiting ",
    ] {
        assert!(barriers.contains(want), "{want:?} in {barriers}");
    }
    assert!(
        barriers.contains(" ago"),
        "task 17's last heartbeat: {barriers}"
    );
    let summary = text(section(&dom, "nssummary").expect("the summary"));
    assert!(
        summary.contains("1,023 connected · 0 disconnected · 1 error"),
        "{summary}"
    );
    assert!(summary.contains("Barriers pending 1"), "{summary}");
    let errors = text(section(&dom, "errors").expect("the errors section"));
    assert!(
        errors.contains("/job:jax_worker/replica:0/task:5"),
        "{errors}"
    );
    assert!(errors.contains("out of memory on TPU 0"), "{errors}");
    // The grid: one cell per task, the one in ERROR is task 5's.
    assert!(dom.contains("data-cells=\"1024\""), "{dom}");
    assert!(dom.contains("data-error-cells=\"5\""), "{dom}");
    // Task 5's page pins its cell; the readout reads the cell's state.
    let task5 = browser::dom(&format!("{url}/task/5")).await;
    let readout = text(section(&task5, "readout").unwrap_or(""));
    assert!(
        readout.contains("task 5") && readout.contains("ERROR"),
        "{readout}"
    );
    browser::screenshot(&url, &screenshot_path("namespace.png"), (1400, 1000)).await;

    // The overview lists the namespace with its task in error and the
    // barrier, and the cluster's three members, ready.
    let overview = dom_showing(
        &format!("http://{}/ui/", http[f]),
        "three ready members",
        |d| d.matches(">ready<").count() == 3 && d.contains(NS),
    )
    .await;
    let row = text(&overview);
    assert!(row.contains(NS), "{row}");
    browser::screenshot(
        &format!("http://{}/ui/", http[f]),
        &screenshot_path("overview.png"),
        (1400, 800),
    )
    .await;

    // What does not exist is a 404, on the page and in its JSON.
    for path in [
        "/ui/ns/nope".to_string(),
        format!("/ui/ns/{NS}/task/jax_worker/4096"),
        format!("/ui/ns/{NS}/barrier/nope"),
        "/ui/api/namespaces/nope".to_string(),
        format!("/ui/api/namespaces/{NS}/barriers/nope"),
    ] {
        let got = http_get(&http[f], &path).map(|(s, _)| s);
        assert_eq!(got, Some(404), "{path}");
    }
    let missing = browser::dom(&format!("http://{}/ui/ns/nope", http[f])).await;
    assert!(
        text(&missing).contains("404 — namespace nope does not exist"),
        "{}",
        text(&missing)
    );
}

/// Strings users chose, holding markup, show as text: a job name, an error
/// message, a barrier id, keys (which the page only counts), PyTorch store
/// keys waited on and counted. And a
/// namespace of 65,536 tasks draws.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn markup_from_users_shows_as_text() {
    let http = coordstore_tests::free_addrs(1);
    let cluster = Cluster::start(1, &["--metrics-listen", &http[0]]);
    cluster.wait_leader(&[0], WAIT).await;
    let addr = cluster.nodes[0].addr.clone();
    let job = format!("w{IMG}{BOLD}");
    let settings = NamespaceSettings {
        jobs: vec![proto::coordstore::JobCount {
            name: job.clone(),
            count: 2,
        }],
        recoverable: true,
        ..Default::default()
    };
    ns::create(&addr, "markup", settings).await.expect("create");
    let agents: Vec<agent::Agent> = (0..2)
        .map(|t| {
            let mut cfg = agent::AgentConfig::new(vec![addr.clone()], &job, t);
            cfg.namespace = Some("markup".into());
            agent::Agent::new(cfg, Arc::new(|_| {})).expect("agent")
        })
        .collect();
    // Both at once: the registration barrier holds each until both came.
    let connects: Vec<_> = agents
        .iter()
        .map(|a| {
            let a = a.clone();
            tokio::spawn(async move { a.connect().await })
        })
        .collect();
    for c in connects {
        c.await.unwrap().expect("connect");
    }
    agents[0]
        .insert_key_value(&format!("k{IMG}"), BOLD)
        .await
        .unwrap();
    let barrier = format!("b{BOLD}{IMG}");
    let _waiting = agents[0].wait_at_barrier_async(&barrier, Duration::from_secs(3600), &[]);
    let message = format!("boom {IMG} {BOLD}");
    agents[1]
        .report_error(tonic::Status::internal(message.clone()))
        .await
        .expect("report");
    wait_arrivals(&addr, "markup", &barrier, 1).await;

    let url = format!("http://{}/ui/ns/markup", http[0]);
    let dom = dom_showing(&url, "the error and the barrier", |d| {
        section(d, "errors").is_some_and(|e| e.contains("boom"))
            && section(d, "barriers").is_some_and(|b| b.contains("Missing 1:"))
    })
    .await;
    // No element the strings describe exists, and the title is the page's.
    assert!(!dom.contains("<img"), "{dom}");
    assert!(!dom.contains("<b id=\"injected\""), "{dom}");
    assert!(dom.contains("<title>coordstore · markup</title>"), "{dom}");
    // The strings are there, as text (escaped in the dumped markup).
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    for s in [esc(&message), esc(&barrier), esc(&job)] {
        assert!(dom.contains(&s), "{s} in {dom}");
    }
    browser::screenshot(&url, &screenshot_path("markup.png"), (1400, 1000)).await;
    // The same on the barrier's own page.
    let one = browser::dom(&format!("{url}/barrier/{}", urlencode(&barrier))).await;
    assert!(
        !one.contains("<img") && one.contains(&esc(&barrier)),
        "{one}"
    );

    // PyTorch store keys are a client's bytes too: a rank waits on one and
    // ADDs to another, each holding markup; the store's section shows them
    // as text.
    let mut waiter = agent::torch::StoreClient::connect(&addr, 7)
        .await
        .expect("connect");
    let waited = format!("/k{IMG}{BOLD}");
    waiter
        .send(&proto::torch::Op::Wait {
            keys: vec![waited.clone()],
        })
        .await
        .expect("wait");
    let mut adder = agent::torch::StoreClient::connect(&addr, 8)
        .await
        .expect("connect");
    let counter = format!("/c{BOLD}{IMG}");
    assert_eq!(adder.add(&counter, 3).await.expect("add"), 3);
    let torch_url = format!("http://{}/ui/ns/default", http[0]);
    let dom = dom_showing(&torch_url, "the torch keys", |d| {
        section(d, "torch").is_some_and(|t| {
            text(t).contains("1 connection waits") && t.contains("class=\"counter\"")
        })
    })
    .await;
    assert!(!dom.contains("<img"), "{dom}");
    assert!(!dom.contains("<b id=\"injected\""), "{dom}");
    assert!(dom.contains("<title>coordstore · default</title>"), "{dom}");
    let torch = section(&dom, "torch").unwrap();
    for s in [esc(&waited), esc(&counter)] {
        assert!(torch.contains(&s), "{s} in {torch}");
    }

    // A namespace of 65,536 tasks draws: one canvas cell each.
    ns::create(&addr, "big", ns::tasks(65_536))
        .await
        .expect("create");
    let big = format!("http://{}/ui/ns/big", http[0]);
    let dom = dom_showing(&big, "65,536 cells", |d| d.contains("data-cells=\"65536\"")).await;
    assert!(dom.contains("data-draw-ms="), "{dom}");
    let summary = text(section(&dom, "nssummary").expect("the summary"));
    assert!(summary.contains("65,536 disconnected"), "{summary}");
}

/// `s` percent-encoded for a path segment.
fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// CPU seconds (user + system) and resident bytes of process `pid`.
fn usage(pid: u32) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, r)| r)
        .split_whitespace()
        .collect();
    // SAFETY: sysconf has no preconditions.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    let ticks: f64 = [11, 12]
        .iter()
        .filter_map(|&i| fields.get(i)?.parse::<f64>().ok())
        .sum();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0);
    (ticks / tick, rss_kb * 1024)
}

/// For `length`, puts keys one after another through `client`: each put's
/// latency in µs, sorted.
async fn put_for(
    client: &mut proto::coordstore::node_client::NodeClient<tonic::transport::Channel>,
    length: Duration,
) -> Vec<u128> {
    let mut w = coordstore_tests::Writer::new();
    let mut took = Vec::new();
    let end = std::time::Instant::now() + length;
    while std::time::Instant::now() < end {
        let t0 = std::time::Instant::now();
        w.put(client, &format!("load/{}", took.len() % 1000), b"v", WAIT)
            .await
            .expect("put");
        took.push(t0.elapsed().as_micros());
    }
    took.sort_unstable();
    took
}

/// One phase's line: the node's CPU and RSS, the puts' rate and latency.
async fn measure(
    what: &str,
    pid: u32,
    client: &mut proto::coordstore::node_client::NodeClient<tonic::transport::Channel>,
    length: Duration,
) {
    let (cpu0, _) = usage(pid);
    let took = put_for(client, length).await;
    let (cpu1, rss) = usage(pid);
    let q = |p: f64| took[((took.len() - 1) as f64 * p) as usize];
    eprintln!(
        "{what}: node CPU {:.1}% of a core, RSS {} MiB; {} puts/s, p50 {} us, p99 {} us",
        100.0 * (cpu1 - cpu0) / length.as_secs_f64(),
        rss >> 20,
        took.len() as u64 / length.as_secs(),
        q(0.5),
        q(0.99)
    );
}

/// What the page costs its node, measured by hand (release build):
/// `COORDSTORE_BIN=$PWD/target/release/coordstore cargo test -p
/// coordstore-tests --test ui -- --ignored --nocapture`. One node (the
/// page's cost is its own node's; the leader's, which also answers what
/// only the leader knows), a namespace of 16,384 registered tasks, one in
/// ERROR, and a barrier of all of them that two never reach, a writer
/// putting keys. First the node's CPU per refresh of the page; then 30 s
/// each: without the page, with what the page reads fetched every 2 s (no
/// browser on the machine), with the page open in Chromium (refreshing
/// every 2 s; on a small machine the browser's own CPU competes with the
/// node's), with the overview open too.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
#[ignore]
async fn what_the_page_costs_on_16384_tasks() {
    const N: i32 = 16_384;
    let http = coordstore_tests::free_addrs(1);
    let cluster = Cluster::start(1, &["--metrics-listen", &http[0]]);
    cluster.wait_leader(&[0], WAIT).await;
    let addr = cluster.nodes[0].addr.clone();
    let settings = NamespaceSettings {
        tasks: N as u32,
        recoverable: true,
        heartbeat_timeout_ms: Some(3_600_000),
        ..Default::default()
    };
    ns::create(&addr, NS, settings).await.expect("create");
    let job = XlaJob::register(&addr, NS, N).await;
    job.report_error(5, "out of memory on TPU 0").await;
    // A barrier of every task (as jaxlib sends one: no task list), which
    // tasks 5 (in error) and 17 do not reach.
    let _parked = job.arrive(
        BARRIER,
        (0..N).filter(|&t| t != 5 && t != 17),
        &[],
        Duration::from_secs(3600),
    );
    wait_arrivals(&addr, NS, BARRIER, N as u64 - 2).await;
    let pid = cluster.nodes[0].pid().expect("the node's pid");
    let mut client = connect(&addr, WAIT).await;
    let phase = Duration::from_secs(30);
    let url = format!("http://{}/ui/ns/{NS}", http[0]);
    let t0 = std::time::Instant::now();
    let body = http_get(&http[0], &format!("/ui/api/namespaces/{NS}")).expect("JSON");
    eprintln!(
        "the namespace's JSON: {} KiB in {} ms",
        body.1.len() >> 10,
        t0.elapsed().as_millis()
    );
    // One refresh of the namespace's page (its two JSON reads), 100 times.
    let (cpu0, _) = usage(pid);
    for _ in 0..100 {
        http_get(&http[0], &format!("/ui/api/namespaces/{NS}")).expect("JSON");
        http_get(&http[0], "/ui/api/cluster").expect("JSON");
    }
    let (cpu1, _) = usage(pid);
    eprintln!(
        "a refresh of the namespace's page: {:.2} ms of the node's CPU",
        (cpu1 - cpu0) * 1000.0 / 100.0
    );
    measure("no page", pid, &mut client, phase).await;
    // What the open page asks, every 2 s, without a browser on the machine.
    let poll = {
        let (h, path) = (http[0].clone(), format!("/ui/api/namespaces/{NS}"));
        tokio::spawn(async move {
            loop {
                let (h2, p2) = (h.clone(), path.clone());
                let _ = tokio::task::spawn_blocking(move || {
                    http_get(&h2, &p2);
                    http_get(&h2, "/ui/api/cluster");
                })
                .await;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        })
    };
    measure("the page's reads every 2 s", pid, &mut client, phase).await;
    poll.abort();
    let _page = browser::keep_open(&url);
    measure("namespace page open in Chromium", pid, &mut client, phase).await;
    measure("namespace page and overview open", pid, &mut client, phase).await;
}
