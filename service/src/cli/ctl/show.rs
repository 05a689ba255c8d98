//! Each listing verb's `-o table`, read from the verb's own JSON (see
//! [`super::table`]).

use serde_json::Value;

use super::table::{against, bytes, cell, duration, fields, heard, ms, num, task_ref, val, Table};
use super::TfDataCommand;

fn items(v: &Value) -> &[Value] {
    v.as_array().map_or(&[][..], Vec::as_slice)
}

/// `ctl status -o table`: the node in a few lines, then its members.
pub fn status(v: &Value) -> String {
    let leader = match v["leader_id"].as_u64() {
        Some(id) => id.to_string(),
        None => "none".into(),
    };
    let head = fields(&[
        (
            "node",
            format!("{} ({})", num(v, "node_id"), val(&v["role"])),
        ),
        ("leader", format!("{leader} (term {})", num(v, "term"))),
        (
            "applied",
            format!(
                "{} (last log {}, snapshot {})",
                num(v, "last_applied"),
                num(v, "last_log_index"),
                num(v, "snapshot_index")
            ),
        ),
        ("parked calls", num(v, "parked_calls").to_string()),
        ("namespaces", num(v, "namespaces").to_string()),
        (
            "feature level",
            format!(
                "{} (cluster {})",
                num(v, "feature_level"),
                num(v, "cluster_feature_level")
            ),
        ),
        ("state digest", val(&v["state_digest"])),
        ("disk", disk(&v["disk"])),
    ]);
    let mut t = Table::new(&["NODE", "ADDRESS", "ROLE", "LEVEL"]).right(&[0]);
    for m in items(&v["members"]) {
        t.row(vec![
            num(m, "id").to_string(),
            val(&m["address"]),
            val(&m["role"]),
            val(&m["feature_level"]),
        ]);
    }
    format!("{head}\n{}", t.render())
}

/// The disk line of `ctl status -o table`: what is wrong, else free space
/// and the fdatasync percentile.
fn disk(d: &Value) -> String {
    if d.is_null() {
        return "-".into();
    }
    let mut line = match d["problem"].as_str() {
        Some(p) => format!("UNHEALTHY: {p}"),
        None => format!(
            "{} free (reserve {}), fdatasync p99 {} ms",
            d["free_bytes"].as_u64().map_or("?".into(), bytes),
            bytes(num(d, "reserve_bytes")),
            d["fsync_p99_ms"].as_f64().unwrap_or(0.0)
        ),
    };
    if let Some(r) = d["refusing_writes"].as_str() {
        line.push_str(&format!("; REFUSING WRITES: {r}"));
    }
    if let Some(t) = d["last_transfer"].as_str() {
        line.push_str(&format!("; handed leadership {t}"));
    }
    line
}

/// `ctl ns ls -o table`: one line per namespace.
pub fn namespaces(v: &Value) -> String {
    let mut t = Table::new(&[
        "NAME", "PORT", "TASKS", "CONN", "DISC", "ERR", "KEYS", "BYTES", "PARKED", "BARRIERS",
        "OLDEST", "TTL",
    ])
    .right(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
    for n in items(v) {
        let tasks = &n["tasks"];
        let total = num(tasks, "connected") + num(tasks, "disconnected") + num(tasks, "error");
        let spec = &n["spec"];
        t.row(vec![
            val(&n["name"]),
            port(num(n, "port")),
            total.to_string(),
            num(tasks, "connected").to_string(),
            num(tasks, "disconnected").to_string(),
            num(tasks, "error").to_string(),
            against(num(n, "keys"), &spec["max_keys"], |k| k.to_string()),
            against(num(n, "bytes"), &spec["max_bytes"], bytes),
            against(num(n, "parked_calls"), &spec["max_parked_calls"], |k| {
                k.to_string()
            }),
            num(n, "barriers_pending").to_string(),
            waited(n, "oldest_barrier_ms", "oldest_barrier_at_least"),
            ms(spec, "ttl_ms"),
        ]);
    }
    t.render()
}

fn port(p: u64) -> String {
    if p == 0 {
        "-".into()
    } else {
        p.to_string()
    }
}

/// A wait the leader measured: `≥` when it counts from its takeover.
fn waited(v: &Value, key: &str, at_least: &str) -> String {
    match (v[key].as_u64(), v[at_least].as_bool()) {
        (Some(w), Some(true)) => format!(">={}", duration(Some(w))),
        (w, _) => duration(w),
    }
}

/// `ctl ns get -o table`: the namespace in a few lines, then its pending
/// barriers.
pub fn namespace(v: &Value) -> String {
    let tasks = &v["tasks"];
    let spec = &v["spec"];
    let head = fields(&[
        ("namespace", val(&v["name"])),
        ("port", port(num(v, "port"))),
        (
            "tasks",
            format!(
                "{} connected, {} disconnected, {} in error",
                num(tasks, "connected"),
                num(tasks, "disconnected"),
                num(tasks, "error")
            ),
        ),
        (
            "keys",
            against(num(v, "keys"), &spec["max_keys"], |k| k.to_string()),
        ),
        ("bytes", against(num(v, "bytes"), &spec["max_bytes"], bytes)),
        (
            "parked calls",
            against(num(v, "parked_calls"), &spec["max_parked_calls"], |k| {
                k.to_string()
            }),
        ),
        ("epoch", num(v, "epoch").to_string()),
        ("ttl", ms(spec, "ttl_ms")),
        ("listener", val(&v["listener"])),
    ]);
    let mut out = head;
    out.push('\n');
    match (&v["pending_barriers"], &v["pending_barriers_error"]) {
        (Value::Array(b), _) if b.is_empty() => out.push_str("no barrier is pending\n"),
        (Value::Array(_), _) => out.push_str(&barrier_tables(&v["pending_barriers"], "PENDING")),
        (_, e) => out.push_str(&format!("pending barriers: {}\n", val(e))),
    }
    out.push_str(&torch_waits(v));
    out
}

/// `ctl ns get -o table`'s lines on the PyTorch store: the keys most
/// waited on, or that none is.
fn torch_waits(v: &Value) -> String {
    let w = &v["torch_waits"];
    if w.is_null() {
        return match &v["torch_waits_error"] {
            Value::Null => String::new(),
            e => format!("PyTorch store waits: {}\n", val(e)),
        };
    }
    let (conns, keys) = (num(w, "waiting_connections"), num(w, "keys_waited_on"));
    if conns == 0 {
        return "no PyTorch store key is waited on\n".into();
    }
    let mut t = Table::new(&["KEY", "WAITING", "OLDEST WAIT"]).right(&[1]);
    for k in items(&w["keys"]) {
        t.row(vec![
            val(&k["key"]),
            num(k, "waiting").to_string(),
            ms(k, "oldest_wait_ms"),
        ]);
    }
    let s = |n: u64| if n == 1 { "" } else { "s" };
    format!(
        "\nPyTorch store: {conns} connection{} wait on {keys} key{} (ctl torch names who):\n{}",
        s(conns),
        s(keys),
        t.render()
    )
}

/// `ctl tasks -o table`: one line per task.
pub fn tasks(v: &Value) -> String {
    let mut t = Table::new(&["TASK", "STATE", "LAST HEARTBEAT", "INCARNATION", "ERROR"]);
    for task in items(v) {
        t.row(vec![
            task_ref(task),
            val(&task["state"]),
            heard(task),
            format!("{:016x}", num(task, "incarnation")),
            match &task["error"] {
                Value::Null => String::new(),
                e => val(e),
            },
        ]);
    }
    t.render()
}

/// Barriers in one table, then the tasks each pending one waits for.
fn barrier_tables(v: &Value, status: &str) -> String {
    let mut t = Table::new(&[
        "BARRIER", "COUNTER", "STATUS", "ARRIVED", "WAITED", "DEADLINE",
    ])
    .right(&[1]);
    let mut waiting = String::new();
    for b in items(v) {
        let st = b["status"].as_str().unwrap_or(status);
        t.row(barrier_row(b, st));
        if st == "PENDING" {
            waiting.push_str(&missing(b));
        }
    }
    format!("{}{waiting}", t.render())
}

/// One barrier's row.
fn barrier_row(b: &Value, status: &str) -> Vec<String> {
    let count = |n: &str, list: &str| match (b[n].as_u64(), b[list].as_array()) {
        (Some(n), _) => n,
        (None, Some(a)) => a.len() as u64,
        _ => 0,
    };
    let now = crate::core::now_ms();
    let deadline = match num(b, "deadline_ms") {
        0 => "-".into(),
        _ if status != "PENDING" => "-".into(),
        d if d > now => format!("in {}", duration(Some(d - now))),
        _ => "passed".into(),
    };
    vec![
        val(&b["id"]),
        b["counter"].as_i64().unwrap_or(0).to_string(),
        status.to_string(),
        format!(
            "{}/{}",
            count("arrived_count", "arrived"),
            count("participant_count", "participants")
        ),
        waited(b, "waited_ms", "waited_at_least"),
        deadline,
    ]
}

/// The tasks a pending barrier waits for, under a line naming it.
fn missing(b: &Value) -> String {
    let shown = items(&b["missing"]);
    let count = b["missing_count"].as_u64().unwrap_or(shown.len() as u64);
    if count == 0 {
        return String::new();
    }
    let plural = if count == 1 { "" } else { "s" };
    let mut out = format!("\n{} waits for {count} task{plural}:\n", val(&b["id"]));
    let mut t = Table::new(&["TASK", "STATE", "LAST HEARTBEAT"]);
    for task in shown {
        t.row(vec![task_ref(task), val(&task["state"]), heard(task)]);
    }
    out.push_str(&t.render_indented("  "));
    if count > shown.len() as u64 {
        out.push_str(&format!("  ... and {} more\n", count - shown.len() as u64));
    }
    out
}

/// `ctl barriers -o table`: every barrier; the tasks each pending one
/// waits for under them.
pub fn barriers(v: &Value) -> String {
    if items(v).is_empty() {
        return "no barriers\n".into();
    }
    barrier_tables(v, "")
}

/// `ctl torch -o table`: a line on the store, the keys waited on, each
/// key's waiters, the counters, the connections by node.
pub fn torch(v: &Value) -> String {
    let waiting = num(v, "waiting_connections");
    let keys = num(v, "keys_waited_on");
    let s = |n: u64| if n == 1 { "" } else { "s" };
    let head = fields(&[
        (
            "store",
            format!(
                "{} keys, {} (read on node {} at index {})",
                num(v, "stored_keys"),
                bytes(num(v, "stored_bytes")),
                num(v, "node_id"),
                num(v, "read_index")
            ),
        ),
        (
            "waiting",
            format!(
                "{waiting} connection{} on {keys} key{}",
                s(waiting),
                s(keys)
            ),
        ),
        ("last write", format!("{} ago", ms(v, "last_write_age_ms"))),
    ]);
    let mut out = format!("{head}\n");
    out.push_str(&torch_keys(v));
    if !items(&v["counters"]).is_empty() {
        out.push('\n');
        out.push_str(&torch_counters(v));
    }
    let mut t = Table::new(&["NODE", "CONNECTIONS", "WAITING", "ERROR"]).right(&[0, 1, 2]);
    for n in items(&v["nodes"]) {
        t.row(vec![
            num(n, "node_id").to_string(),
            val(&n["connections"]),
            val(&n["waiting"]),
            val(&n["error"]),
        ]);
    }
    out.push('\n');
    out.push_str(&t.render());
    out
}

/// The keys waited on, then each one's waiters under a line naming it.
fn torch_keys(v: &Value) -> String {
    if items(&v["keys"]).is_empty() {
        return String::new();
    }
    let mut t = Table::new(&["KEY", "WAITING", "OLDEST WAIT"]).right(&[1]);
    for k in items(&v["keys"]) {
        t.row(vec![
            val(&k["key"]),
            num(k, "waiting").to_string(),
            ms(k, "oldest_wait_ms"),
        ]);
    }
    let mut out = t.render();
    for k in items(&v["keys"]) {
        out.push_str(&format!("\n{} is waited on by:\n", val(&k["key"])));
        let mut t = Table::new(&["NODE", "ADDRESS", "PID", "WAITED", "CONNECTION"]);
        for w in items(&k["waiters"]) {
            t.row(vec![
                val(&w["node_id"]),
                val(&w["address"]),
                val(&w["pid"]),
                ms(w, "waited_ms"),
                val(&w["connection"]),
            ]);
        }
        out.push_str(&t.render_indented("  "));
        let more = num(k, "waiting").saturating_sub(items(&k["waiters"]).len() as u64);
        if more > 0 {
            out.push_str(&format!("  ... and {more} more\n"));
        }
    }
    out
}

/// The counters ranks ADD to, with what each counts to where known.
fn torch_counters(v: &Value) -> String {
    let mut t = Table::new(&["COUNTER", "VALUE", "OF", "ADDS", "LAST ADD"]).right(&[1, 2, 3]);
    for c in items(&v["counters"]) {
        let of = match (&c["of"], &c["of_from"]) {
            (Value::Null, _) => "-".to_string(),
            (n, from) => format!("{} ({})", val(n), val(from)),
        };
        t.row(vec![
            val(&c["key"]),
            val(&c["value"]),
            of,
            num(c, "adds").to_string(),
            format!("{} ago", ms(c, "last_add_ms")),
        ]);
    }
    t.render()
}

/// `ctl kv ls -o table`: key and value.
pub fn keys(v: &Value) -> String {
    let mut t = Table::new(&["KEY", "VALUE"]);
    for e in items(v) {
        t.row(vec![val(&e["key"]), val(&e["value"])]);
    }
    t.render()
}

/// `ctl tfdata ... -o table`.
pub fn tfdata(what: TfDataCommand, v: &Value) -> String {
    let (head, keys): (&[&'static str], &[&str]) = match what {
        TfDataCommand::Datasets => (
            &["DATASET", "DEFINITION BYTES", "COMPRESSION"],
            &["dataset_id", "definition_bytes", "compression"],
        ),
        TfDataCommand::Jobs => (
            &["JOB", "NAME", "DATASET", "SHARDING", "CONSUMERS"],
            &[
                "job_id",
                "name",
                "dataset_id",
                "sharding_policy",
                "num_consumers",
            ],
        ),
        TfDataCommand::Iterations => (
            &["ITERATION", "JOB", "REPETITION", "CLIENTS", "FINISHED"],
            &[
                "iteration_id",
                "job_id",
                "repetition",
                "num_clients",
                "finished",
            ],
        ),
        TfDataCommand::Workers => (&["ADDRESS", "TAGS", "UID"], &["address", "tags", "uid"]),
        TfDataCommand::Tasks => (
            &["TASK", "ITERATION", "WORKER", "FINISHED"],
            &["task_id", "iteration_id", "worker_address", "finished"],
        ),
    };
    let mut t = Table::new(head);
    for row in items(v) {
        t.row(keys.iter().map(|k| cell_of(&row[*k])).collect());
    }
    t.render()
}

/// A tf.data field as a cell (a list joined with commas).
fn cell_of(v: &Value) -> String {
    match v {
        Value::Array(a) => cell(&a.iter().map(val).collect::<Vec<_>>().join(",")),
        other => val(other),
    }
}
