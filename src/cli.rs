//! The command line: its arguments (clap) and the dispatch to one file per
//! command (`commands/`).

use crate::prelude::*;
use clap::{Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(name = "ccattler", version, about = "A declarative operator whose control logic is Datalog")]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum Format {
    Text,
    Json,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(crate) enum LogFormat {
    Text,
    Json,
}

pub(crate) fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CCATTLER_LOG").unwrap_or_else(|_| "info".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

#[derive(Subcommand)]
pub(crate) enum Command {
    /// The controller daemon: bridge + engine, leader election, /healthz /readyz /metrics.
    Controller {
        #[command(flatten)]
        etcd: EtcdArgs,
        #[arg(long, default_value = "rules")]
        rules: Vec<PathBuf>,
        /// Address for /healthz, /readyz and /metrics (and /ui with --ui).
        #[arg(long, default_value = "127.0.0.1:9090")]
        listen: std::net::SocketAddr,
        /// Also serve the read-only web console at /ui on --listen.
        #[arg(long)]
        ui: bool,
        /// The console's own credential: a `NAME:PASSWORD` file (mode 0600)
        /// whose users a browser must present (HTTP basic auth). Required
        /// with --ui when etcd's auth is on.
        #[arg(long, requires = "ui")]
        ui_credentials: Option<PathBuf>,
        /// This controller's name in `status/leader` (default: host and pid).
        #[arg(long)]
        id: Option<String>,
        /// Engine worker threads (default: one per core; per process with
        /// --hosts, the same in every process).
        #[arg(long, default_value_t = ccattler_engine::default_workers())]
        workers: usize,
        /// Run the engine as a timely cluster of processes (one failure
        /// domain): FILE lists every process's host:port, one a line; the
        /// same file, rules and --workers in every process.
        #[arg(long, requires = "process")]
        hosts: Option<PathBuf>,
        /// This process's index in --hosts: 0 reads etcd, leads or stands by
        /// and writes back; the others only evaluate (no etcd, no listener).
        #[arg(long, requires = "hosts")]
        process: Option<usize>,
        /// Operations per transaction (etcd's --max-txn-ops).
        #[arg(long, default_value_t = 128)]
        max_txn_ops: usize,
        /// Bytes of keys and values per transaction: under etcd's
        /// --max-request-bytes (1.5 MiB by default).
        #[arg(long, default_value_t = 1 << 20)]
        max_txn_bytes: usize,
        /// Seconds the leader key may stand still before a standby takes it
        /// (the leader rewrites it every third of this), 1 to 3600.
        #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(i64).range(1..=3600))]
        leader_ttl: i64,
        /// The cluster's secret key file (mode 0600): secret values are
        /// re-sealed to the nodes whose instances are granted them.
        #[arg(long, env = "CCATTLER_SECRET_KEY")]
        secret_key: Option<PathBuf>,
        /// Seconds without progress (etcd unreachable, write-back failing,
        /// a delivered revision not applied) before /healthz fails.
        #[arg(long, default_value_t = 60)]
        stall_bound: u64,
        #[arg(long, value_enum, default_value = "text")]
        log_format: LogFormat,
    },
    /// A service's rolling update: its generation, how many instances run
    /// its template and how many of those are ready, and its state
    /// (progressing, complete, paused, stalled with the reason).
    Rollout {
        #[command(subcommand)]
        action: RolloutAction,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// The autoscaler daemon (as etcd user `autoscaler`): its own rules
    /// (default `rules/autoscaler`) over what the controller publishes,
    /// writing `intent/autoscaler/` only; one leads, others stand by.
    Autoscaler {
        #[command(flatten)]
        etcd: EtcdArgs,
        #[arg(long, default_value = "rules/autoscaler")]
        rules: Vec<PathBuf>,
        /// Seconds between rounds, 1 to 3600 (a standby takes over after three).
        #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
        period: u64,
        /// This autoscaler's name in `intent/autoscaler/leader` (default: host-pid).
        #[arg(long)]
        id: Option<String>,
        #[arg(long, value_enum, default_value = "text")]
        log_format: LogFormat,
    },
    /// Take a node out of service and back: cordon (nothing new goes there),
    /// drain (its instances move elsewhere within disruption budgets),
    /// uncordon (back in service). Thin commands over `desired/node/N/…`.
    Node {
        #[command(subcommand)]
        action: NodeAction,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// etcd users and roles (DESIGN §6): bootstrap, add-node, remove-node, rotate.
    Auth {
        #[command(subcommand)]
        action: AuthAction,
    },
    /// Secret values, sealed with the cluster key: set (value from stdin), rm, reseal.
    Secret {
        #[command(subcommand)]
        action: SecretAction,
    },
    /// The node agent: lease, observed facts, runs placed instances, probes them.
    Agent {
        #[command(flatten)]
        etcd: EtcdArgs,
        /// This node's name.
        #[arg(long)]
        node: String,
        /// Capacity in millicores.
        #[arg(long)]
        cpu: i64,
        /// Capacity in MiB.
        #[arg(long)]
        memory: i64,
        /// The IP address instances listen on and endpoints point to.
        #[arg(long)]
        address: String,
        /// A node label, `KEY=VALUE` (repeatable).
        #[arg(long = "label", value_parser = parse_label)]
        labels: Vec<(String, String)>,
        /// Capacity of another resource, `NAME=AMOUNT` (repeatable), e.g. `gpu=2`.
        #[arg(long = "resource", value_parser = parse_resource)]
        resources: Vec<(String, i64)>,
        /// Lease TTL in seconds: the node is unreachable this long after the agent dies.
        #[arg(long, default_value_t = 30)]
        ttl: i64,
        /// Where the agent keeps its lease, instance records, logs and volumes.
        #[arg(long, default_value = "/var/lib/ccattler/agent")]
        state_dir: PathBuf,
        /// Seconds between SIGTERM and SIGKILL when stopping an instance.
        #[arg(long, default_value_t = 5)]
        grace: u64,
        /// The uids instances and exec probes run as, one per instance,
        /// `START-END`; `off` runs them as the agent's own user. Default:
        /// 200000-299999 when the agent runs as root, else off.
        #[arg(long)]
        instance_uids: Option<String>,
        /// The most processes one instance may run at once (its cgroup's pids.max).
        #[arg(long, default_value_t = 4096)]
        instance_pids_max: i64,
        /// Seconds between full re-reads of the specs and of what etcd holds
        /// from this agent (placement changes are watched and act at once).
        #[arg(long, default_value_t = 5)]
        resync: u64,
        #[arg(long, value_enum, default_value = "text")]
        log_format: LogFormat,
    },
    /// The built-in `builtin:http` image (run by the agent, not by hand).
    #[command(hide = true)]
    ServeHttp {
        #[arg(long)]
        instance: String,
    },
    /// An instance's supervisor (started by the agent, not by hand): runs the
    /// command, and stops it if the agent dies before the node's lease expires.
    #[command(hide = true)]
    Supervise {
        #[arg(long)]
        alive: PathBuf,
        #[arg(long)]
        deadline: PathBuf,
        /// SIGTERM → SIGKILL when fencing, in ms.
        #[arg(long, default_value_t = 5000)]
        fence_grace_ms: u64,
        /// A cgroup directory the instance joins (one per hierarchy; repeatable).
        #[arg(long = "cgroup")]
        cgroups: Vec<PathBuf>,
        /// Run the instance as this uid (and gid).
        #[arg(long)]
        uid: Option<u32>,
        #[arg(long)]
        gid: Option<u32>,
        #[arg(last = true, required = true)]
        command: Vec<std::ffi::OsString>,
    },
    /// Write a facts file as the user: only keys under `desired/` and `intent/user/`.
    Apply {
        /// Facts file: one `KEY = VALUE` a line, or `- KEY` to delete it.
        file: PathBuf,
        /// Write as another intent writer (e.g. `autoscaler`): only `intent/<writer>/`.
        #[arg(long, default_value = "user")]
        writer: String,
        /// The rules every key and value is checked against before anything is written.
        #[arg(long, default_value = "rules")]
        rules: Vec<PathBuf>,
        /// Write keys no rule reads too (otherwise each is an error: a typo, most likely).
        #[arg(long)]
        allow_unknown: bool,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Delete keys under the writer's own prefixes, in one transaction; a key
    /// that does not exist is named and nothing is deleted.
    Delete {
        #[arg(required = true)]
        keys: Vec<String>,
        /// Delete as another intent writer (e.g. `autoscaler`): only `intent/<writer>/`.
        #[arg(long, default_value = "user")]
        writer: String,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// The cluster as tables, as `kubectl get` and `nomad status` print them:
    /// a summary, or nodes, services, instances, pending instances (with
    /// why) or rollouts.
    Status {
        #[arg(value_enum)]
        view: Option<View>,
        /// Follow the cluster: redraw whenever it changes.
        #[arg(long)]
        watch: bool,
        /// `-o wide`: more columns.
        #[arg(short = 'o', long = "output", value_enum)]
        output: Option<Output>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Read facts under a prefix, sorted.
    Get {
        /// Key prefix (e.g. `effective/service/web/`); empty for everything.
        #[arg(default_value = "")]
        prefix: String,
        #[command(flatten)]
        etcd: EtcdArgs,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// What the controller would write and delete right now; writes nothing.
    Plan {
        #[command(flatten)]
        etcd: EtcdArgs,
        #[arg(long, default_value = "rules")]
        rules: Vec<PathBuf>,
        /// What if: apply these changes (`KEY = VALUE` puts, `- KEY`
        /// deletes) to the live state (or to --facts) and print how the
        /// derived keys would change, to a fixed point; nothing is written.
        #[arg(long)]
        with: Option<PathBuf>,
        /// With --with: start from a facts file instead of live etcd.
        #[arg(long, requires = "with")]
        facts: Option<PathBuf>,
    },
    /// Parse and check rule files (default `rules/`); exit 1 with diagnostics.
    Check {
        /// Rule files or directories of `*.rules`.
        paths: Vec<PathBuf>,
        /// Also check a facts file against the rules: values that would be
        /// rejected (errors) and keys no input reads (warnings, with the
        /// nearest key one does).
        #[arg(long)]
        facts: Option<PathBuf>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Run rule tests (`*.test` files; default `rules/tests/`).
    Test {
        /// Test files or directories.
        paths: Vec<PathBuf>,
        #[arg(long, default_value = "rules")]
        rules: Vec<PathBuf>,
        /// Run only cases whose name contains this text.
        #[arg(long)]
        run: Option<String>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Why a derived fact holds (its derivation down to the stored keys), or why not.
    Explain {
        /// A key (`placement/instance/web-3`), or `KEY=VALUE` to ask about one value.
        key: String,
        /// Also say why it does not hold: every rule that could derive it, and what fails.
        #[arg(long)]
        why_not: bool,
        /// Explain over a facts file instead of live etcd.
        #[arg(long, conflicts_with_all = ["revision", "controller"])]
        facts: Option<PathBuf>,
        /// Ask a running controller (its --listen address, e.g.
        /// http://127.0.0.1:9090): answered from its warm engine at the
        /// revision it has applied, with no snapshot to read.
        #[arg(long, conflicts_with = "revision")]
        controller: Option<String>,
        /// Read etcd at this revision (default: the latest).
        #[arg(long)]
        revision: Option<i64>,
        #[command(flatten)]
        etcd: EtcdArgs,
        #[arg(long, default_value = "rules")]
        rules: Vec<PathBuf>,
        /// Levels of the derivation tree shown; deeper facts are cut with a marker.
        #[arg(long, default_value_t = 12)]
        depth: usize,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// What a relation or a key is: its columns, key pattern, doc, and the
    /// rules that derive and read it (every relation when none is given).
    Describe {
        /// A relation name, or a key (`effective/service/web/instances`).
        what: Option<String>,
        #[arg(long, default_value = "rules")]
        rules: Vec<PathBuf>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// A language server for rule files on stdin/stdout (diagnostics, go to
    /// definition, references, hover, completion): point an editor's LSP
    /// client at `ccattler lsp`; see editors/README.md.
    Lsp,
    /// Shell completions for bash, zsh or fish, from the command definitions:
    /// `ccattler completions bash > /etc/bash_completion.d/ccattler`.
    Completions { shell: clap_complete::Shell },
    /// Man pages (roff), from the command definitions: one for `ccattler`
    /// and one per command (`ccattler-apply.1`, …) written into DIR.
    Man {
        /// Where to write the pages (created if missing).
        #[arg(long, default_value = "man")]
        dir: PathBuf,
    },
    /// Evaluate the rules offline over a facts file; print every derived fact.
    Eval {
        /// Facts file: one `KEY = VALUE` a line.
        #[arg(long)]
        facts: PathBuf,
        #[arg(long, default_value = "rules")]
        rules: Vec<PathBuf>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        /// Engine worker threads (default: one per core; per process with
        /// --processes).
        #[arg(long, default_value_t = ccattler_engine::default_workers())]
        workers: usize,
        /// Run the engine as a timely cluster of this many local processes
        /// over loopback TCP (this one and N-1 it starts); the output is the
        /// same as with one.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
        processes: u16,
        /// (Set by --processes for the processes it starts.) The cluster's
        /// hosts file, one host:port a line.
        #[arg(long, hide = true, requires = "process")]
        hosts: Option<PathBuf>,
        /// (Set by --processes.) This process's index in the hosts file.
        #[arg(long, hide = true, requires = "hosts")]
        process: Option<usize>,
    },
}

#[derive(Subcommand)]
pub(crate) enum RolloutAction {
    /// Print the rollout's status; with --watch, follow it until it is
    /// complete (exit 0), stalled (exit 1) or paused (exit 1).
    Status {
        service: String,
        #[arg(long)]
        watch: bool,
        /// With --watch: give up after this many seconds (exit 1).
        #[arg(long, default_value_t = 600)]
        timeout: u64,
    },
}

#[derive(Subcommand)]
pub(crate) enum NodeAction {
    /// `desired/node/N/cordon = true`: no new instance is placed on N; what runs there stays.
    Cordon { node: String },
    /// Removes N's cordon and drain: it takes instances again.
    Uncordon { node: String },
    /// `desired/node/N/drain = true`: N's instances move elsewhere, a
    /// disruption budget's worth at a time (`effective/node/N/state`:
    /// draining, then drained; `status/drain/N/S` says what holds it back).
    Drain {
        node: String,
        /// Wait until the node is drained, printing what holds it back, for at most this many seconds.
        #[arg(long)]
        wait: Option<u64>,
    },
}

#[derive(Subcommand)]
pub(crate) enum AuthAction {
    /// Against an etcd without auth: users root, controller, user and
    /// autoscaler with their roles; their passwords appended to --credentials
    /// (0600, never printed); the cluster's secret key created if absent; auth enabled.
    Bootstrap {
        #[command(flatten)]
        etcd: EtcdArgs,
        /// The cluster's secret key file to create if it does not exist (mode 0600).
        #[arg(long, env = "CCATTLER_SECRET_KEY")]
        secret_key: Option<PathBuf>,
    },
    /// Node NAME's agent user and role `agent-NAME`, confined to its own
    /// prefixes; its password appended to --credentials. Runs as root.
    AddNode {
        node: String,
        /// The addresses its instances may be reached at (CIDR networks,
        /// comma-separated): endpoints take no address outside them, whatever
        /// the agent reports. Recorded as desired/node/NAME/address_range.
        #[arg(long, value_name = "CIDR[,CIDR…]", value_parser = parse_networks)]
        address_range: Option<String>,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Deletes node NAME's agent user and role: its agent can no longer
    /// read or write anything. Runs as root.
    RemoveNode {
        node: String,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// A new password for USER, appended to --credentials; the old one stops
    /// working at once. Runs as root.
    Rotate {
        user: String,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Grants every existing role what this version's role table gives it
    /// (after an upgrade that widened one); revokes nothing. Runs as root.
    Regrant {
        #[command(flatten)]
        etcd: EtcdArgs,
    },
}

#[derive(Subcommand)]
pub(crate) enum SecretAction {
    /// Reads the value from stdin (exact bytes; never from the command line),
    /// seals it with the cluster key into `secret/value/NAME` and records
    /// `desired/secret/NAME` = the revision it was stored at (its tag): the
    /// instances granted it roll to the new value within their rollout's
    /// budget, as to a new image.
    Set {
        name: String,
        #[arg(long, env = "CCATTLER_SECRET_KEY")]
        secret_key: PathBuf,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Deletes `secret/value/NAME` and `desired/secret/NAME`; the controller
    /// deletes the copies sealed to nodes.
    Rm {
        name: String,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
    /// Seals every value again with the first key of --secret-key (after a
    /// new key was put first in the file). Reads and writes `secret/value/`:
    /// runs as root.
    Reseal {
        #[arg(long, env = "CCATTLER_SECRET_KEY")]
        secret_key: PathBuf,
        #[command(flatten)]
        etcd: EtcdArgs,
    },
}

/// Exit codes: 0 ok, 1 the input is wrong (diagnostics), 2 usage or I/O error.
pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
        }
    };
    let result = match cli.command {
        Command::Check { paths, facts, format } => check(paths, facts.as_deref(), format),
        Command::Controller {
            etcd,
            rules,
            listen,
            ui,
            ui_credentials,
            id,
            workers,
            hosts,
            process,
            max_txn_ops,
            max_txn_bytes,
            leader_ttl,
            secret_key,
            stall_bound,
            log_format,
        } => {
            init_logging(log_format);
            exit_on_panic();
            let cluster = match (hosts, process) {
                (Some(hosts), Some(process)) => match ccattler_engine::Cluster::from_hosts_file(&hosts, process, workers) {
                    Ok(c) => Some(c),
                    Err(e) => return usage_error(anyhow::anyhow!("--hosts: {e}")),
                },
                _ => None,
            };
            // A group's other processes evaluate only: no etcd, no listener.
            if let Some(c) = cluster.as_ref().filter(|c| c.process != 0) {
                controller_serve(&rules, c)
            } else {
                let id = id.unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()));
                let etcd = match etcd.config() {
                    Ok(c) => c,
                    Err(e) => return usage_error(e),
                };
                // The console shows what the controller's etcd user reads: with
                // etcd's auth on, it needs a credential of its own.
                let ui = match (ui, ui_credentials) {
                    (false, _) => None,
                    (true, None) if etcd.user.is_some() => {
                        return usage_error(anyhow::anyhow!(
                            "--ui with etcd's auth on needs --ui-credentials FILE (NAME:PASSWORD lines, mode 0600): the console's own credential"
                        ))
                    }
                    (true, None) => Some(Vec::new()),
                    (true, Some(file)) => match ccattler_store::credentials::read_all(&file) {
                        Ok(users) if !users.is_empty() => Some(users.into_iter().map(|(u, p)| (u, p.to_string())).collect()),
                        Ok(_) => return usage_error(anyhow::anyhow!("--ui-credentials {}: no NAME:PASSWORD line", file.display())),
                        Err(e) => return usage_error(anyhow::anyhow!("--ui-credentials: {e}")),
                    },
                };
                let cfg = ccattler_bridge::controller::ControllerConfig {
                    etcd,
                    ui,
                    rules,
                    workers,
                    cluster,
                    max_txn_ops,
                    max_txn_bytes,
                    leader_ttl,
                    id,
                    listen: Some(listen),
                    secret_key,
                    stall_bound: std::time::Duration::from_secs(stall_bound.max(1)),
                };
                controller(cfg)
            }
        }
        Command::Agent { etcd, node, cpu, memory, address, labels, resources, ttl, state_dir, grace, instance_uids, instance_pids_max, resync, log_format } => {
            init_logging(log_format);
            let root = ccattler_agent::confine::running_as_root();
            let instance_uids = match instance_uids.as_deref() {
                Some("off") => None,
                Some(range) => match range.parse::<ccattler_agent::confine::UidRange>() {
                    Ok(r) if root => Some(r),
                    Ok(_) => {
                        return usage_error(anyhow::anyhow!(
                            "--instance-uids {range}: only an agent running as root can run instances as other users (or pass off)"
                        ))
                    }
                    Err(e) => return usage_error(anyhow::anyhow!("--instance-uids: {e}")),
                },
                None => root.then_some(ccattler_agent::confine::UidRange { start: 200_000, end: 299_999 }),
            };
            if instance_pids_max <= 0 {
                return usage_error(anyhow::anyhow!("--instance-pids-max must be a positive number of processes, not {instance_pids_max}"));
            }
            let cfg = ccattler_agent::AgentConfig {
                etcd: match etcd.config() {
                    Ok(c) => c,
                    Err(e) => return usage_error(e),
                },
                node,
                cpu,
                memory,
                address,
                labels: labels.into_iter().collect(),
                resources: resources.into_iter().collect(),
                ttl,
                state_dir,
                grace: std::time::Duration::from_secs(grace),
                resync: std::time::Duration::from_secs(resync.max(1)),
                instance_uids,
                pids_max: instance_pids_max,
            };
            agent(cfg)
        }
        Command::ServeHttp { instance } => serve_http(instance),
        Command::Supervise { alive, deadline, fence_grace_ms, cgroups, uid, gid, command } => {
            let signals = ccattler_agent::supervise::Signals { alive, deadline };
            let confinement = ccattler_agent::supervise::Confinement {
                cgroup: (!cgroups.is_empty()).then(|| ccattler_agent::confine::InstanceCgroup::from_dirs(cgroups)),
                user: uid.map(|u| (u, gid.unwrap_or(u))),
            };
            let grace = std::time::Duration::from_millis(fence_grace_ms);
            std::process::exit(ccattler_agent::supervise::run(&signals, grace, &confinement, &command[0], &command[1..]));
        }
        Command::Node { action, etcd } => node(action, &etcd),
        Command::Autoscaler { etcd, rules, period, id, log_format } => {
            init_logging(log_format);
            exit_on_panic();
            let cfg = ccattler_bridge::autoscaler::AutoscalerConfig {
                etcd: match etcd.config() {
                    Ok(c) => c,
                    Err(e) => return usage_error(e),
                },
                rules,
                period: std::time::Duration::from_secs(period),
                id: id.unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id())),
            };
            autoscaler(cfg)
        }
        Command::Rollout { action: RolloutAction::Status { service, watch, timeout }, etcd } => rollout_status(&service, watch, timeout, &etcd),
        Command::Auth { action } => auth(action),
        Command::Secret { action } => secret(action),
        Command::Plan { etcd, rules, with: Some(with), facts } => what_if(&etcd, &rules, &with, facts.as_deref()),
        Command::Plan { etcd, rules, with: None, .. } => plan(&etcd, &rules),
        Command::Apply { file, writer, rules, allow_unknown, etcd } => apply(&file, &writer, &rules, allow_unknown, &etcd),
        Command::Delete { keys, writer, etcd } => delete(&keys, &writer, &etcd),
        Command::Get { prefix, etcd, format } => get(&prefix, &etcd, format),
        Command::Status { view, watch, output, format, etcd } => status(view, watch, output, format, &etcd),
        Command::Explain { key, why_not, facts, controller, revision, etcd, rules, depth, format } => match controller {
            Some(url) => explain_served(&url, &key, why_not, depth, format),
            None => explain(&key, why_not, facts.as_deref(), revision, &etcd, &rules, depth, format),
        },
        Command::Eval { facts, rules, format, workers, processes, hosts, process } => match (hosts, process) {
            (Some(hosts), Some(process)) => eval_serve(&rules, &hosts, process, workers),
            _ => eval(&facts, &rules, format, workers, processes.into()),
        },
        Command::Describe { what, rules, format } => describe(what.as_deref(), &rules, format),
        Command::Completions { shell } => completions(shell),
        Command::Man { dir } => man(&dir),
        Command::Lsp => ccattler_lsp::run_stdio().map(|()| ExitCode::SUCCESS).map_err(anyhow::Error::from),
        Command::Test { paths, rules, run, format } => test(paths, &rules, run.as_deref(), format),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {}", crate::etcd_args::describe(&e));
            ExitCode::from(2)
        }
    }
}

pub(crate) fn parse_resource(s: &str) -> Result<(String, i64), String> {
    let (k, v) = s.split_once('=').filter(|(k, _)| !k.is_empty()).ok_or_else(|| format!("{s:?} is not NAME=AMOUNT"))?;
    let amount = v.parse::<i64>().map_err(|_| format!("{s:?}: {v:?} is not a whole number"))?;
    Ok((k.to_string(), amount))
}

pub(crate) fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

pub(crate) fn parse_networks(s: &str) -> Result<String, String> {
    ccattler_parser::ast::check_networks(s)?;
    Ok(s.split(',').map(str::trim).collect::<Vec<_>>().join(","))
}
