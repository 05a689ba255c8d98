//! `torch --real-clients`: the start-up of N ranks made by stock torch's
//! own `TCPStore` client (`bench/python/torch_clients.py`: the torch
//! venv's Python, 8 processes of one thread per rank) instead of this
//! binary's generator, against the same peers. Phases (see the script):
//! `connect` (torch's client connects, validates and ADDs `init/`),
//! `init` (an ADD and a SET), `barrier1` (torch's `_store_based_barrier`),
//! `nccl-id` (rank 0 SETs, every rank GETs) and `barrier2`; each timed by
//! the script from its go to its slowest rank, with each server's CPU and
//! RSS, the Raft entries and the kernel's listen overflows around it. The
//! script's name lookups are numeric as torch's server's are (the same
//! shim, preloaded).

use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};

use crate::scale::raise_nofile;
use crate::torch::{
    numeric_shim, server_cells, timed, torch_python, Load, Peer, PhaseRow, Row, Servers,
};

/// The script's phases, in order; `connect` is timed apart from the rest.
const PHASES: [&str; 5] = ["connect", "init", "barrier1", "nccl-id", "barrier2"];

/// Every peer (but the floor, which answers no SET), every N.
pub async fn run(peers: &[Peer], load: &Load, procs: usize) -> Vec<Row> {
    raise_nofile();
    let mut rows = Vec::new();
    for &peer in peers.iter().filter(|&&p| p != Peer::Floor) {
        for &n in &load.ranks {
            eprintln!("torch (torch's clients): {}, {n} ranks", peer.name());
            let row = one(peer, n, load, procs).await.unwrap_or_else(|e| Row {
                peer: peer.name(),
                ranks: n,
                agents: 0,
                outcome: format!("failed: {e:#}"),
                phases: Vec::new(),
            });
            eprintln!(
                "torch (torch's clients): {} {n}: {}",
                peer.name(),
                row.outcome
            );
            rows.push(row);
        }
    }
    rows
}

/// The script's answer for one phase: `PHASE {json}`.
#[derive(serde::Deserialize)]
struct Answer {
    phase: String,
    seconds: f64,
    errors: u64,
    first_error: Option<String>,
}

/// One peer, one N.
async fn one(peer: Peer, n: usize, load: &Load, procs: usize) -> anyhow::Result<Row> {
    let servers = Servers::start(peer, n).await?;
    let pids = servers.pids();
    let addrs: Vec<String> = servers.addrs.iter().map(|(a, _)| a.to_string()).collect();
    let err = std::env::temp_dir().join("coordstore-bench-torch-clients.err");
    let mut script = tokio::process::Command::new(torch_python()?)
        .arg(coordstore_tests::workspace().join("bench/python/torch_clients.py"))
        .args(["--addresses", &addrs.join(",")])
        .args(["--ranks", &n.to_string(), "--procs", &procs.to_string()])
        .args(["--timeout-s", &load.phase_timeout.as_secs().to_string()])
        .env("LD_PRELOAD", numeric_shim()?)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(&err)?)
        .kill_on_drop(true)
        // Its client processes with it: a group of their own to end.
        .process_group(0)
        .spawn()?;
    let _group = Group(script.id());
    let mut stdin = script.stdin.take().expect("piped");
    let mut lines = BufReader::new(script.stdout.take().expect("piped")).lines();
    let ready = tokio::time::timeout(Duration::from_secs(300), lines.next_line()).await;
    anyhow::ensure!(
        matches!(&ready, Ok(Ok(Some(l))) if l == "READY"),
        "torch's clients did not start (their stderr: {})",
        err.display()
    );
    let mut row = Row {
        peer: peer.name(),
        ranks: n,
        agents: 0,
        outcome: "ok".into(),
        phases: Vec::new(),
    };
    let wait = load.phase_timeout + Duration::from_secs(30);
    for name in PHASES {
        let answer = answer(&mut stdin, &mut lines, name, wait, &err);
        if row.record(timed(&servers, &pids, name, answer).await) {
            break;
        }
    }
    // The script ends its client processes once its input ends (and the
    // group is killed when this returns, whatever is left of it).
    drop(stdin);
    let _ = tokio::time::timeout(Duration::from_secs(30), script.wait()).await;
    Ok(row)
}

/// The script's process group, killed when dropped (also on an early
/// return): the script and the client processes it started.
struct Group(Option<u32>);

impl Drop for Group {
    fn drop(&mut self) {
        if let Some(pid) = self.0.and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill has no memory preconditions; a group already
            // gone is ESRCH, ignored.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
        }
    }
}

/// Phase `name` run by the script (its go written to `stdin`, its
/// answer read from `lines`): (seconds, errors, first error).
async fn answer(
    stdin: &mut tokio::process::ChildStdin,
    lines: &mut tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    name: &str,
    wait: Duration,
    err: &std::path::Path,
) -> (f64, u64, Option<String>) {
    let answer = async {
        stdin.write_all(b"go\n").await?;
        stdin.flush().await?;
        let line = lines.next_line().await?.unwrap_or_default();
        let json = line.strip_prefix("PHASE ").unwrap_or_default();
        anyhow::Ok(serde_json::from_str::<Answer>(json)?)
    };
    match tokio::time::timeout(wait, answer).await {
        Ok(Ok(a)) if a.phase == name => (a.seconds, a.errors, a.first_error),
        Ok(Ok(a)) => (0.0, 1, Some(format!("the script ran {}", a.phase))),
        Ok(Err(e)) => (
            0.0,
            1,
            Some(format!("the script: {e:#} ({})", err.display())),
        ),
        Err(_) => (
            wait.as_secs_f64(),
            1,
            Some("the script did not answer".into()),
        ),
    }
}

/// Seconds of the phases named, summed; `None` if any is missing.
fn seconds(r: &Row, names: &[&str]) -> Option<f64> {
    names
        .iter()
        .map(|n| r.phases.iter().find(|p| p.phase == *n).map(|p| p.seconds))
        .sum()
}

/// `x` as a ratio to torch's server's figure for the same N, if any.
fn ratio(x: Option<f64>, torch: Option<f64>) -> String {
    match (x, torch) {
        (Some(x), Some(t)) if t > 0.0 => format!("{x:.2} ({:.2}×)", x / t),
        (Some(x), _) => format!("{x:.2}"),
        _ => "—".into(),
    }
}

/// The markdown: each phase, then connect and init..barrier2 against
/// torch's server's.
pub fn table(rows: &[Row]) -> String {
    let mut md = String::from(
        "Start-up by stock torch clients (torch_clients.py):\n\n\
         | peer | ranks | phase | s | server CPU s | server RSS MiB | Raft entries | errors | listen overflows |\n\
         |---|---:|---|---:|---|---|---:|---:|---:|\n",
    );
    for r in rows {
        if r.phases.is_empty() {
            md.push_str(&format!(
                "| {} | {} | — | — | — | — | — | {} | — |\n",
                r.peer, r.ranks, r.outcome
            ));
        }
        for p in &r.phases {
            md.push_str(&phase_line(r, p));
        }
    }
    md.push_str(
        "\n| peer | ranks | connect s (× torch's) | init..barrier2 s (× torch's) | outcome |\n\
         |---|---:|---:|---:|---|\n",
    );
    let rest = &PHASES[1..];
    for r in rows {
        let torch = rows
            .iter()
            .find(|t| t.peer == Peer::Torch.name() && t.ranks == r.ranks);
        md.push_str(&format!(
            "| {} | {} | {} | {} | {} |\n",
            r.peer,
            r.ranks,
            ratio(
                seconds(r, &["connect"]),
                torch.and_then(|t| seconds(t, &["connect"]))
            ),
            ratio(seconds(r, rest), torch.and_then(|t| seconds(t, rest))),
            r.outcome
        ));
    }
    md
}

/// One phase's line of the first table.
fn phase_line(r: &Row, p: &PhaseRow) -> String {
    let (cpu, mem) = server_cells(p);
    format!(
        "| {} | {} | {} | {:.2} | {} | {} | {} | {} | {} |\n",
        r.peer,
        r.ranks,
        p.phase,
        p.seconds,
        cpu,
        mem,
        p.log_entries.map_or("—".into(), |e| e.to_string()),
        p.errors,
        p.listen_overflows.map_or("?".into(), |o| o.to_string())
    )
}
