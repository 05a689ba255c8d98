//! Why is this PyTorch job stuck: a stock torch 2.15 gloo job of 4 ranks
//! whose store is a 3-node coordstore cluster (the ranks spread over the
//! nodes), stuck as torch jobs get stuck — rank 0 never sets the id the
//! others block in `get` for; a store-based barrier one rank never reaches
//! — and what `ctl torch` (JSON and `-o table`) and the status page of a
//! follower (headless Chromium) say: the key, the 3 waiting ranks by node,
//! address and pid, since when; the barrier's counter at 3 of 4.

use std::sync::Arc;
use std::time::Duration;

use coordstore_tests::browser::{self, section, text};
use coordstore_tests::jax::{torch_python, PyProc};
use coordstore_tests::wait::{eventually, holds};
use coordstore_tests::{coordstore_cli, workspace, Cluster};
use serde_json::Value;

const WAIT: Duration = Duration::from_secs(90);
/// How long torch's start-up of 4 gloo ranks may take on a loaded 2-core
/// machine.
const START: Duration = Duration::from_secs(240);
const WORLD: usize = 4;

/// Starts the `WORLD` ranks of `torch_stuck.py --mode MODE`, rank r on
/// node r % 3, and waits until each is initialized and waits (or holds):
/// the ranks and their pids.
fn stuck_job(cluster: &Cluster, mode: &str) -> (Vec<PyProc>, Vec<u32>) {
    let mut ranks: Vec<PyProc> = (0..WORLD)
        .map(|rank| {
            let addr = &cluster.nodes[rank % 3].addr;
            let (host, port) = addr.rsplit_once(':').expect("HOST:PORT");
            let args: Vec<String> = [
                "--rank",
                &rank.to_string(),
                "--world",
                &WORLD.to_string(),
                "--host",
                host,
                "--port",
                port,
                "--mode",
                mode,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            PyProc::spawn_with(
                &torch_python(),
                "torch_stuck.py",
                &args,
                cluster.dir.path(),
                &[],
            )
        })
        .collect();
    for (rank, r) in ranks.iter_mut().enumerate() {
        let then = if rank == 0 { "holding" } else { "waiting" };
        r.wait_line_starting(&format!("{{\"rank\": {rank}, \"{then}\""), START);
    }
    let pids = ranks
        .iter()
        .map(|r| {
            let line = r
                .lines()
                .into_iter()
                .find(|l| l.contains("\"initialized\""))
                .expect("the initialized line");
            let v: Value = serde_json::from_str(&line).unwrap();
            v["pid"].as_u64().expect("a pid") as u32
        })
        .collect();
    (ranks, pids)
}

/// `ctl torch` against `addr` (JSON), once `shown` holds of it.
async fn ctl_torch_showing(
    addr: &str,
    what: &str,
    shown: impl Fn(&Value) -> bool + Send + Sync,
) -> Value {
    let shown = Arc::new(shown);
    let addr = addr.to_string();
    eventually(format!("ctl torch to show {what}"), WAIT, move || {
        let (addr, shown) = (addr.clone(), shown.clone());
        async move {
            let (ok, out, err) = coordstore_cli(&["ctl", "--endpoint", &addr, "torch"]).await;
            holds(ok, || format!("{out}{err}"))?;
            let v: Value = serde_json::from_str(&out).map_err(|e| format!("{e}: {out}"))?;
            holds(shown(&v), || out.clone())?;
            Ok::<_, String>(v)
        }
    })
    .await
}

/// The DOM of `url` once its PyTorch store section holds `want`.
async fn page_showing(url: &str, want: &str) -> String {
    let (url, want) = (url.to_string(), want.to_string());
    eventually(format!("{url} to show {want}"), WAIT, move || {
        let (url, want) = (url.clone(), want.clone());
        async move {
            let dom = browser::dom(&url).await;
            let torch = section(&dom, "torch").map(text).unwrap_or_default();
            holds(torch.contains(&want), || text(&dom))?;
            Ok::<_, String>(dom)
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_stuck_torch_job_shows_the_key_its_ranks_wait_on_and_a_barrier_one_short() {
    let http = coordstore_tests::free_addrs(3);
    let h = http.clone();
    let cluster = Cluster::start_each(3, &[], move |i| {
        vec!["--metrics-listen".into(), h[i].clone()]
    });
    let leader = cluster.wait_leader(&[0, 1, 2], WAIT).await;
    let f = (leader + 1) % 3;
    let follower = cluster.nodes[f].addr.clone();

    // Rank 0 never sets the id: ranks 1, 2, 3 block in get.
    let (ranks, pids) = stuck_job(&cluster, "id");
    let key = "/job7/nccl_id";
    let v = ctl_torch_showing(&follower, "3 ranks waiting on the id", |v| {
        v["keys"][0]["key"] == key
            && v["keys"][0]["waiters"]
                .as_array()
                .is_some_and(|w| w.len() == 3 && w.iter().all(|w| w["pid"].is_u64()))
    })
    .await;
    let k = &v["keys"][0];
    assert_eq!(v["keys_waited_on"], 1, "{v}");
    assert_eq!(k["waiting"], 3, "{v}");
    assert!(k["oldest_wait_ms"].is_u64(), "{v}");
    let mut got: Vec<u64> = k["waiters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["pid"].as_u64().unwrap())
        .collect();
    got.sort_unstable();
    let mut want: Vec<u64> = pids[1..].iter().map(|p| *p as u64).collect();
    want.sort_unstable();
    assert_eq!(got, want, "the waiters are ranks 1-3: {v}");
    for w in k["waiters"].as_array().unwrap() {
        assert!(
            w["address"].as_str().unwrap().starts_with("127.0.0.1:"),
            "{v}"
        );
        assert!(w["waited_ms"].is_u64(), "{v}");
    }
    // Ranks 1, 2, 3 hold their store connections on nodes 1, 2, 0: each
    // node names the ones it holds.
    let by_node: Vec<(u64, u64)> = k["waiters"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| (w["node_id"].as_u64().unwrap(), w["pid"].as_u64().unwrap()))
        .collect();
    for (rank, pid) in pids.iter().enumerate().skip(1) {
        let node = cluster.nodes[rank % 3].id;
        assert!(
            by_node.contains(&(node, *pid as u64)),
            "rank {rank} on node {node}: {v}"
        );
    }
    let nodes = v["nodes"].as_array().unwrap();
    assert_eq!(nodes.len(), 3, "{v}");
    let waiting: u64 = nodes.iter().map(|n| n["waiting"].as_u64().unwrap()).sum();
    assert_eq!(waiting, 3, "{v}");
    assert!(v["last_write_age_ms"].is_u64(), "{v}");

    // Each node's metric of its oldest store wait: the one holding rank 1.
    let (status, m) = coordstore_tests::http_get(&http[1], "/metrics").expect("/metrics");
    assert_eq!(status, 200, "{m}");
    let oldest = coordstore_tests::metric_sample(
        &m,
        r#"coordstore_namespace_oldest_store_wait_seconds{namespace="default"}"#,
    );
    assert!(oldest.is_some_and(|s| s >= 0.0), "{m}");

    // The same in a table.
    let (ok, out, err) =
        coordstore_cli(&["ctl", "--endpoint", &follower, "-o", "table", "torch"]).await;
    assert!(ok, "{out}{err}");
    assert!(out.contains("/job7/nccl_id is waited on by:"), "{out}");
    for pid in &pids[1..] {
        assert!(out.contains(&pid.to_string()), "pid {pid} in {out}");
    }

    // `ns get` says it too, where it said only "parked calls 3".
    let (ok, out, err) = coordstore_cli(&[
        "ctl",
        "--endpoint",
        &follower,
        "-o",
        "table",
        "ns",
        "get",
        "default",
    ])
    .await;
    assert!(ok, "{out}{err}");
    assert!(
        out.contains("PyTorch store: 3 connections wait on 1 key"),
        "{out}"
    );
    assert!(out.contains(key), "{out}");

    // And on the follower's page.
    let url = format!("http://{}/ui/ns/default", http[f]);
    let dom = page_showing(&url, "3 connections wait").await;
    let torch = text(section(&dom, "torch").expect("the torch section"));
    assert!(torch.contains(key), "{torch}");
    for pid in &pids[1..] {
        assert!(torch.contains(&pid.to_string()), "pid {pid} in {torch}");
    }
    browser::screenshot(
        &url,
        &workspace().join("target/ui-screenshots/torch-stuck-id.png"),
        (1400, 1200),
    )
    .await;
    drop(ranks);

    // The killed ranks' waits end with their connections.
    ctl_torch_showing(&follower, "no key waited on", |v| v["keys_waited_on"] == 0).await;
    let (ok, out, err) = coordstore_cli(&["ctl", "--endpoint", &follower, "reset-job"]).await;
    assert!(ok, "{out}{err}");

    // A store barrier that rank 0 never reaches: its counter at 3 of 4.
    let (_ranks, _) = stuck_job(&cluster, "barrier");
    let counter = "/store_based_barrier_key:stuck";
    let last_worker = format!("{counter}:last_worker");
    let lw = last_worker.clone();
    let v = ctl_torch_showing(
        &follower,
        "the barrier's counter at 3, 3 ranks waiting",
        move |v| {
            let counted = v["counters"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["key"] == counter && c["value"] == 3));
            // Each rank's wait times out every 10 s and is sent again: between
            // the two, 2 wait.
            let waiting = v["keys"].as_array().is_some_and(|k| {
                k.iter()
                    .any(|k| k["key"] == lw.as_str() && k["waiting"] == 3)
            });
            counted && waiting
        },
    )
    .await;
    let c = v["counters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["key"] == counter)
        .unwrap();
    assert_eq!(
        (&c["value"], &c["of"], &c["of_from"]),
        (&3.into(), &4.into(), &"init/".into()),
        "{v}"
    );
    let k = v["keys"]
        .as_array()
        .unwrap()
        .iter()
        .find(|k| k["key"] == last_worker.as_str());
    assert!(k.is_some_and(|k| k["oldest_wait_ms"].is_u64()), "{v}");
    let (ok, out, err) =
        coordstore_cli(&["ctl", "--endpoint", &follower, "-o", "table", "torch"]).await;
    assert!(ok, "{out}{err}");
    let row = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(counter))
        .unwrap_or_else(|| panic!("a row for {counter} in {out}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&cells[1..3], &["3", "4"], "{out}");
    let dom = page_showing(&url, counter).await;
    // The counter's row: key, value, what it counts to.
    let row = dom
        .split("<tr class=\"counter\">")
        .nth(1)
        .and_then(|r| r.split("</tr>").next())
        .unwrap_or_default();
    let cells: Vec<String> = row
        .split("<td")
        .skip(1)
        .map(|c| text(&format!("<td{c}")))
        .collect();
    assert_eq!(
        cells.get(..3),
        Some(&[counter.to_string(), "3".into(), "4".into()][..]),
        "{row}"
    );
    browser::screenshot(
        &url,
        &workspace().join("target/ui-screenshots/torch-stuck-barrier.png"),
        (1400, 1200),
    )
    .await;
}
