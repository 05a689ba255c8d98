//! Stock TensorFlow 2.21 tf.data service workers (`WorkerServer`, separate
//! processes) and clients (`distribute()`, `register_dataset` /
//! `from_dataset_id`) with coordstore as their dispatcher, on one node and
//! on a follower of three: exact multisets of elements for sharding OFF with
//! two workers, repeated epochs, a named job shared by two clients, a
//! registered dataset read by id, DYNAMIC sharding of `range` and
//! `from_tensor_slices` (every element once), static DATA sharding over the
//! node's worker list (every element once), and coordinated reads by two
//! consumers (round by round from the same worker); an epoch in flight while the leader is
//! SIGKILLed (clients and workers on a follower, or on a relay whose node is
//! the one killed) finishes with every element, and a new job runs after it;
//! clients and workers ride through a whole-cluster SIGKILL and restart on
//! their old ids; a worker SIGKILLed and restarted on its port gets its task
//! again (which reruns from the start: a prefix is read twice).
//! Afterwards every iteration is finished and every iteration client
//! released in the replicated state. Needs the venv made by
//! `scripts/setup-tf.sh` (scripts/test.sh runs it).

use std::time::Duration;

use coordstore_tests::jax::{tf_python, PyProc};
use coordstore_tests::{free_port, wait_state, Cluster, NodeProc};

const WAIT: Duration = Duration::from_secs(90);
const RUN: Duration = Duration::from_secs(240);

fn spawn(cluster: &Cluster, args: &[&str]) -> PyProc {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    PyProc::spawn_with(
        &tf_python(),
        "tfdata_job.py",
        &args,
        cluster.dir.path(),
        &[],
    )
}

fn worker(cluster: &Cluster, dispatcher: &str, port: &str) -> PyProc {
    spawn(
        cluster,
        &["worker", "--dispatcher", dispatcher, "--port", port],
    )
}

/// Two workers and one client running `scenarios` against `dispatcher`;
/// every check of the client must pass.
fn run(cluster: &mut Cluster, dispatcher: &str, scenarios: &str) {
    run_with(cluster, dispatcher, scenarios, &[0, 0], |_, _, _| {});
}

/// [`run`] with the workers on `worker_ports` (0: any), calling `meanwhile`
/// with the client once it runs.
fn run_with(
    cluster: &mut Cluster,
    dispatcher: &str,
    scenarios: &str,
    worker_ports: &[u16; 2],
    meanwhile: impl FnOnce(&mut PyProc, &mut Cluster, &mut Vec<PyProc>),
) {
    let mut workers: Vec<PyProc> = worker_ports
        .iter()
        .map(|port| worker(cluster, dispatcher, &port.to_string()))
        .collect();
    for w in &mut workers {
        w.wait_line("READY", WAIT);
    }
    let mut client = spawn(
        cluster,
        &[
            "client",
            "--dispatcher",
            dispatcher,
            "--scenario",
            scenarios,
            "--workers",
            "2",
            "--n",
            "40",
            "--deadline",
            "200",
        ],
    );
    meanwhile(&mut client, cluster, &mut workers);
    let status = client.wait_exit(RUN);
    let summary_ok = client
        .lines()
        .iter()
        .any(|l| l.contains("\"check\": \"summary\", \"ok\": true"));
    assert!(
        status.success() && client.failed_checks().is_empty() && summary_ok,
        "the tf.data client failed ({status})\n{}\n{}\n{}\n{}",
        client.report(),
        workers[0].report(),
        workers[1].report(),
        cluster.logs()
    );
}

/// Every iteration finished and no client left holding one.
async fn all_released(addr: &str) {
    wait_state(addr, WAIT, |s| {
        let d = s.dispatcher();
        d.iterations().count() > 0
            && d.iterations().all(|it| it.finished && it.num_clients == 0)
            && d.clients().count() == 0
    })
    .await;
}

#[test]
fn stock_tfdata_workers_and_clients_on_one_node() {
    let mut cluster = Cluster::start(1, &[]);
    let addr = cluster.nodes[0].addr.clone();
    run(&mut cluster, &addr, "off,epochs,named,register,dynamic");
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(all_released(&addr));
}

#[test]
fn stock_tfdata_workers_and_clients_on_a_follower_of_three() {
    let mut cluster = Cluster::start(3, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let follower = cluster.nodes[(leader + 1) % 3].addr.clone();
    run(&mut cluster, &follower, "off,register,dynamic");
    rt.block_on(all_released(&cluster.nodes[leader].addr));
}

#[test]
fn a_tfdata_epoch_rides_through_a_leader_kill() {
    let mut cluster = Cluster::start(3, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let follower_index = (leader + 1) % 3;
    let follower = cluster.nodes[follower_index].addr.clone();
    // The epoch in flight when the leader dies finishes with every element;
    // a new job starts after it on the new leader.
    run_with(
        &mut cluster,
        &follower,
        "slow,off",
        &[0, 0],
        |client, cluster, _| {
            client.wait_line("READING", WAIT);
            cluster.kill(leader);
        },
    );
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let new_leader = rt.block_on(cluster.wait_leader(&others, WAIT));
    rt.block_on(all_released(&cluster.nodes[new_leader].addr));
}

#[test]
fn a_tfdata_epoch_through_a_relay_rides_through_the_death_of_its_node() {
    let mut cluster = Cluster::start(3, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let leader = rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    // The relay tries the leader first: the node it talks to dies.
    let mut order: Vec<usize> = vec![leader];
    order.extend((0..3).filter(|&i| i != leader));
    let endpoints: Vec<String> = order
        .iter()
        .map(|&i| cluster.nodes[i].addr.clone())
        .collect();
    let relay_addr = format!("127.0.0.1:{}", free_port());
    let _relay = NodeProc::relay(&relay_addr, &endpoints, cluster.dir.path());
    run_with(
        &mut cluster,
        &relay_addr,
        "slow,register",
        &[0, 0],
        |client, cluster, _| {
            client.wait_line("READING", WAIT);
            cluster.kill(leader);
        },
    );
    let others: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
    let new_leader = rt.block_on(cluster.wait_leader(&others, WAIT));
    rt.block_on(all_released(&cluster.nodes[new_leader].addr));
}

#[test]
fn static_data_sharding_reads_every_element_once() {
    let ports = [free_port(), free_port()];
    let list = format!("localhost:{},localhost:{}", ports[0], ports[1]);
    let mut cluster = Cluster::start(1, &["--tfdata-worker-addresses", &list]);
    let addr = cluster.nodes[0].addr.clone();
    run_with(&mut cluster, &addr, "data", &ports, |_, _, _| {});
}

#[test]
fn clients_and_workers_ride_through_a_whole_cluster_restart() {
    let mut cluster = Cluster::start(3, &[]);
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    let addr = cluster.nodes[0].addr.clone();
    // Every node is SIGKILLed mid-epoch and restarted on its data dir: the
    // client goes on with its old iteration client id, the workers finish
    // their tasks, and the epoch delivers every element.
    run_with(
        &mut cluster,
        &addr,
        "slow,off",
        &[0, 0],
        |client, cluster, _| {
            client.wait_line("READING", WAIT);
            cluster.kill_all();
            for i in 0..3 {
                cluster.restart(i);
            }
        },
    );
    let leader = rt.block_on(cluster.wait_leader(&[0, 1, 2], WAIT));
    rt.block_on(all_released(&cluster.nodes[leader].addr));
}

#[test]
fn a_worker_sigkilled_and_restarted_on_its_port_gets_its_task_again() {
    let ports = [free_port(), free_port()];
    let mut cluster = Cluster::start(1, &[]);
    let addr = cluster.nodes[0].addr.clone();
    let dispatcher = addr.clone();
    run_with(
        &mut cluster,
        &addr,
        "slow-restart",
        &ports,
        |client, cluster, workers| {
            client.wait_line("READING", WAIT);
            // Dropping the process SIGKILLs it; the new one takes its port.
            drop(workers.remove(0));
            let mut back = worker(cluster, &dispatcher, &ports[0].to_string());
            back.wait_line("READY", WAIT);
            workers.push(back);
        },
    );
}

#[test]
fn coordinated_reads_give_two_consumers_their_rounds() {
    let mut cluster = Cluster::start(1, &[]);
    let addr = cluster.nodes[0].addr.clone();
    run(&mut cluster, &addr, "rr");
}

#[test]
fn a_worker_joins_a_running_coordinated_read_through_a_pending_task() {
    let cluster = Cluster::start(1, &[]);
    let addr = cluster.nodes[0].addr.clone();
    let mut first = worker(&cluster, &addr, "0");
    first.wait_line("READY", WAIT);
    let mut client = spawn(
        &cluster,
        &[
            "client",
            "--dispatcher",
            &addr,
            "--scenario",
            "rr-join",
            "--workers",
            "1",
            "--n",
            "300",
            "--deadline",
            "200",
        ],
    );
    client.wait_line("READING", WAIT);
    let mut second = worker(&cluster, &addr, "0");
    second.wait_line("READY", WAIT);
    let status = client.wait_exit(RUN);
    assert!(
        status.success() && client.failed_checks().is_empty(),
        "{status}\n{}\n{}\n{}\n{}",
        client.report(),
        first.report(),
        second.report(),
        cluster.logs()
    );
    // The new worker's task was promoted into the read: two tasks, none
    // pending.
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(wait_state(&addr, WAIT, |s| {
        let d = s.dispatcher();
        d.iterations()
            .any(|it| it.tasks.len() == 2 && it.pending.is_empty())
    }));
}
