//! A coordinator or worker process of the closure-queue tests.
//!
//! * `closure_proc worker NODES QUEUE NAME RUNLOG [PREFETCH]` — runs
//!   closures (taking PREFETCH per get, default 1): appends `ID` to RUNLOG
//!   when it starts one, sleeps the milliseconds the payload names (`ID-MS`
//!   → MS), and answers the payload with `!` appended.
//! * `closure_proc schedule NODES QUEUE TAG N MS` — creates nothing, attaches
//!   to QUEUE and schedules N closures `i-MS`, prints `scheduled N` and
//!   waits to be killed.
//!
//! NODES is a comma-separated list of HOST:PORT.

use std::io::Write;
use std::time::Duration;

use agent::closures::{Coordinator, WorkError, Worker};

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let nodes: Vec<String> = args[2].split(',').map(str::to_string).collect();
    let queue = &args[3];
    match args[1].as_str() {
        "worker" => {
            let worker = Worker::new(&nodes, queue, &args[4]).expect("worker");
            let log = args[5].clone();
            let prefetch: u32 = args.get(6).map_or(1, |p| p.parse().expect("PREFETCH"));
            worker
                .run_prefetching(
                    prefetch,
                    |c| {
                        let log = log.clone();
                        async move {
                            let mut f = std::fs::OpenOptions::new()
                                .create(true)
                                .append(true)
                                .open(&log)
                                .expect("run log");
                            writeln!(f, "{}", c.id).expect("write run log");
                            let text = String::from_utf8_lossy(&c.payload).to_string();
                            let ms: u64 = text
                                .rsplit('-')
                                .next()
                                .and_then(|m| m.parse().ok())
                                .unwrap_or(0);
                            tokio::time::sleep(Duration::from_millis(ms)).await;
                            Ok::<_, WorkError>(format!("{text}!").into_bytes())
                        }
                    },
                    std::future::pending(),
                )
                .await
                .expect("worker loop");
        }
        "schedule" => {
            let coordinator = Coordinator::attach(&nodes, queue, &args[4])
                .await
                .expect("attach");
            let n: u64 = args[5].parse().expect("N");
            let ms = &args[6];
            for i in 0..n {
                coordinator
                    .schedule(format!("{i}-{ms}").into_bytes())
                    .await
                    .expect("schedule");
            }
            println!("scheduled {n}");
            std::future::pending::<()>().await;
        }
        other => panic!("unknown mode {other}"),
    }
}
