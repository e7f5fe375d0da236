use clap::{Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "ccattler", version, about = "A declarative operator whose control logic is Datalog")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Format {
    Text,
    Json,
}

/// How to reach etcd (shared by every command that talks to it).
#[derive(clap::Args, Clone)]
struct EtcdArgs {
    /// etcd endpoint(s), comma-separated.
    #[arg(long, env = "CCATTLER_ETCD", default_value = "http://127.0.0.1:2379", value_delimiter = ',')]
    etcd: Vec<String>,
    /// etcd user (with --etcd-password) when auth is on.
    #[arg(long, env = "CCATTLER_ETCD_USER")]
    etcd_user: Option<String>,
    #[arg(long, env = "CCATTLER_ETCD_PASSWORD", hide_env_values = true)]
    etcd_password: Option<String>,
    /// A credentials file (`NAME:PASSWORD` lines, mode 0600, written by
    /// `ccattler auth`): connect as the user named by --as.
    #[arg(long, env = "CCATTLER_CREDENTIALS", conflicts_with_all = ["etcd_user", "etcd_password"])]
    credentials: Option<PathBuf>,
    /// The user of --credentials to connect as (root, controller, user, autoscaler, agent-NODE).
    #[arg(long = "as", env = "CCATTLER_AS", requires = "credentials")]
    as_user: Option<String>,
    /// PEM file of the CA that signed etcd's certificate (for https:// endpoints).
    #[arg(long, env = "CCATTLER_ETCD_CA")]
    etcd_ca: Option<PathBuf>,
    /// PEM client certificate (with --etcd-key) when etcd asks for one.
    #[arg(long, env = "CCATTLER_ETCD_CERT")]
    etcd_cert: Option<PathBuf>,
    #[arg(long, env = "CCATTLER_ETCD_KEY")]
    etcd_key: Option<PathBuf>,
}

impl EtcdArgs {
    fn config(&self) -> anyhow::Result<ccattler_store::EtcdConfig> {
        self.config_as(None)
    }

    /// The connection, as `default_user` of --credentials when --as is not given.
    fn config_as(&self, default_user: Option<&str>) -> anyhow::Result<ccattler_store::EtcdConfig> {
        let user = match (&self.etcd_user, &self.etcd_password, &self.credentials) {
            (Some(u), Some(p), _) => Some((u.clone(), p.clone())),
            (None, None, None) => None,
            (None, None, Some(file)) => {
                let Some(name) = self.as_user.as_deref().or(default_user) else {
                    anyhow::bail!("--credentials {} needs --as NAME (the user to connect as)", file.display())
                };
                let password = ccattler_store::credentials::password(file, name)?;
                Some((name.to_string(), password.to_string()))
            }
            _ => anyhow::bail!("--etcd-user and --etcd-password go together"),
        };
        if self.etcd_cert.is_some() != self.etcd_key.is_some() {
            anyhow::bail!("--etcd-cert and --etcd-key go together");
        }
        let files = (self.etcd_ca.is_some() || self.etcd_cert.is_some()).then(|| ccattler_store::etcd::TlsFiles {
            ca: self.etcd_ca.clone(),
            cert: self.etcd_cert.clone(),
            key: self.etcd_key.clone(),
        });
        // A missing or unreadable file is named now, not at connect time.
        let tls = files.map(|f| f.options()).transpose()?;
        Ok(ccattler_store::EtcdConfig { endpoints: self.etcd.clone(), user, tls })
    }
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum LogFormat {
    Text,
    Json,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("CCATTLER_LOG").unwrap_or_else(|_| "info".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    match format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

#[derive(Subcommand)]
enum Command {
    /// The controller daemon: bridge + engine, leader election, /healthz /readyz /metrics.
    Controller {
        #[command(flatten)]
        etcd: EtcdArgs,
        #[arg(long, default_value = "rules")]
        rules: Vec<PathBuf>,
        /// Address for /healthz, /readyz and /metrics.
        #[arg(long, default_value = "127.0.0.1:9090")]
        listen: std::net::SocketAddr,
        /// This controller's name in `status/leader` (default: host and pid).
        #[arg(long)]
        id: Option<String>,
        /// Engine worker threads (default: one per core).
        #[arg(long, default_value_t = ccattler_engine::default_workers())]
        workers: usize,
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
        /// Facts file: one `KEY = VALUE` a line.
        file: PathBuf,
        /// Write as another intent writer (e.g. `autoscaler`): only `intent/<writer>/`.
        #[arg(long, default_value = "user")]
        writer: String,
        /// The rules every key and value is checked against before anything is written.
        #[arg(long, default_value = "rules")]
        rules: Vec<PathBuf>,
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
    /// Evaluate the rules offline over a facts file; print every derived fact.
    Eval {
        /// Facts file: one `KEY = VALUE` a line.
        #[arg(long)]
        facts: PathBuf,
        #[arg(long, default_value = "rules")]
        rules: Vec<PathBuf>,
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
        /// Engine worker threads (default: one per core).
        #[arg(long, default_value_t = ccattler_engine::default_workers())]
        workers: usize,
    },
}

#[derive(Subcommand)]
enum RolloutAction {
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
enum NodeAction {
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
enum AuthAction {
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
}

#[derive(Subcommand)]
enum SecretAction {
    /// Reads the value from stdin (exact bytes; never from the command line),
    /// seals it with the cluster key into `secret/value/NAME` and records
    /// `desired/secret/NAME` = a fresh random tag of the value, in one
    /// transaction: the instances granted it roll to the new value within
    /// their rollout's budget, as to a new image.
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
        Command::Controller { etcd, rules, listen, id, workers, max_txn_ops, max_txn_bytes, leader_ttl, secret_key, stall_bound, log_format } => {
            init_logging(log_format);
            exit_on_panic();
            let id = id.unwrap_or_else(|| format!("{}-{}", hostname(), std::process::id()));
            let cfg = ccattler_bridge::controller::ControllerConfig {
                etcd: match etcd.config() {
                    Ok(c) => c,
                    Err(e) => return usage_error(e),
                },
                rules,
                workers,
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
        Command::Apply { file, writer, rules, etcd } => apply(&file, &writer, &rules, &etcd),
        Command::Get { prefix, etcd, format } => get(&prefix, &etcd, format),
        Command::Explain { key, why_not, facts, controller, revision, etcd, rules, depth, format } => match controller {
            Some(url) => explain_served(&url, &key, why_not, depth, format),
            None => explain(&key, why_not, facts.as_deref(), revision, &etcd, &rules, depth, format),
        },
        Command::Eval { facts, rules, format, workers } => eval(&facts, &rules, format, workers),
        Command::Describe { what, rules, format } => describe(what.as_deref(), &rules, format),
        Command::Lsp => ccattler_lsp::run_stdio().map(|()| ExitCode::SUCCESS).map_err(anyhow::Error::from),
        Command::Test { paths, rules, run, format } => test(paths, &rules, run.as_deref(), format),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

fn default_rules(paths: Vec<PathBuf>) -> Vec<PathBuf> {
    if paths.is_empty() {
        vec![PathBuf::from("rules")]
    } else {
        paths
    }
}

fn check(paths: Vec<PathBuf>, facts: Option<&std::path::Path>, format: Format) -> anyhow::Result<ExitCode> {
    let checked = ccattler_parser::load(&default_rules(paths))?;
    let mut ok = checked.errors() == 0;
    if let (Some(file), Some(program)) = (facts, &checked.program) {
        let lines = read_facts(file)?;
        let (mut errors, warnings) = lint_facts(program, file, &lines);
        if errors.is_empty() && checked.errors() == 0 {
            errors = policy_denials(&std::sync::Arc::new(program.clone()), file, &lines)?;
        }
        for l in warnings.iter().chain(&errors) {
            eprintln!("{l}");
        }
        ok &= errors.is_empty();
    }
    match format {
        Format::Text => {
            eprint!("{}", checked.render());
            if let Some(p) = &checked.program {
                println!("{}", ccattler_parser::summary(p));
            } else {
                eprintln!("{} error(s)", checked.errors());
            }
        }
        Format::Json => {
            let diags: Vec<_> = checked.diagnostics.iter().map(|d| ccattler_parser::diag::to_json(&checked.sources, d)).collect();
            let summary = checked.program.as_ref().map(ccattler_parser::summary);
            println!("{}", serde_json::json!({ "ok": ok, "summary": summary, "diagnostics": diags }));
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// Loads and checks rules; on errors prints the diagnostics and returns None.
fn load_program(rules: &[PathBuf]) -> anyhow::Result<Option<std::sync::Arc<ccattler_parser::Program>>> {
    let checked = ccattler_parser::load(rules)?;
    if checked.errors() > 0 {
        eprint!("{}", checked.render());
        eprintln!("{}: {} error(s) in the rules", rules.iter().map(|r| r.display().to_string()).collect::<Vec<_>>().join(", "), checked.errors());
        return Ok(None);
    }
    Ok(checked.program.map(std::sync::Arc::new))
}

fn read_facts(path: &std::path::Path) -> anyhow::Result<Vec<ccattler_engine::factfile::FactLine>> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    Ok(ccattler_engine::factfile::parse(&path.display().to_string(), &text)?)
}

/// A facts file written into an offline session, run to a fixed point as
/// the controller would; with the file's lines (for line numbers).
fn session_from_facts(
    program: std::sync::Arc<ccattler_parser::Program>,
    path: &std::path::Path,
    workers: usize,
) -> anyhow::Result<(ccattler_engine::Session, Vec<ccattler_engine::factfile::FactLine>)> {
    let lines = read_facts(path)?;
    let mut session = ccattler_engine::Session::new(program, workers)?;
    let writes: Vec<(String, Option<String>)> = lines.iter().map(|f| (f.key.clone(), Some(f.value.clone()))).collect();
    session.write(&writes)?;
    Ok((session, lines))
}

fn eval(facts: &std::path::Path, rules: &[PathBuf], format: Format, workers: usize) -> anyhow::Result<ExitCode> {
    let Some(program) = load_program(rules)? else { return Ok(ExitCode::from(1)) };
    let (session, lines) = session_from_facts(program, facts, workers)?;
    let line_of = |key: &str| lines.iter().find(|f| f.key == key).map_or(0, |f| f.line);
    for (key, reason) in session.rejected() {
        eprintln!("{}:{}: rejected {key}: {reason}", facts.display(), line_of(key));
    }
    for c in session.conflicts() {
        let vals: Vec<String> = c.values.iter().map(|(v, rules)| format!("{v:?} (from {})", rules.join(", "))).collect();
        eprintln!("conflict: {} has {} values: {}", c.key, vals.len(), vals.join(", "));
    }
    match format {
        Format::Text => {
            for (k, v) in session.derived() {
                println!("{k} = {}", ccattler_engine::factfile::format_value(v));
            }
        }
        Format::Json => {
            let derived: serde_json::Map<String, serde_json::Value> =
                session.derived().iter().map(|(k, v)| (k.clone(), serde_json::Value::String(v.clone()))).collect();
            let rejected: Vec<_> = session.rejected().iter().map(|(k, r)| serde_json::json!({"key": k, "line": line_of(k), "reason": r})).collect();
            let conflicts: Vec<_> = session.conflicts().map(|c| serde_json::json!({"key": c.key, "values": c.values.iter().map(|(v, r)| serde_json::json!({"value": v, "rules": r})).collect::<Vec<_>>()})).collect();
            println!("{}", serde_json::json!({"derived": derived, "rejected": rejected, "conflicts": conflicts}));
        }
    }
    let clean = session.rejected().is_empty() && session.conflicts().next().is_none();
    Ok(if clean { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

#[allow(clippy::too_many_arguments)]
fn explain(
    asked: &str,
    why_not: bool,
    facts: Option<&std::path::Path>,
    revision: Option<i64>,
    etcd: &EtcdArgs,
    rules: &[PathBuf],
    depth: usize,
    format: Format,
) -> anyhow::Result<ExitCode> {
    use ccattler_engine::explain;
    let Some(program) = load_program(rules)? else { return Ok(ExitCode::from(1)) };
    let (key, value) = split_asked(asked);
    // Where the facts come from, and what the store holds at the key.
    let mut created = None;
    let (session, source, stored) = match facts {
        Some(path) => {
            let (session, _) = session_from_facts(program.clone(), path, 1)?;
            let stored = session.stored_output(key).cloned().map(|v| (v, None));
            (session, format!("facts file {}", path.display()), stored)
        }
        None => {
            let cfg = etcd.config()?;
            let (session, rev, snap) = runtime()?.block_on(ccattler_bridge::explain::snapshot_session(&cfg, program.clone(), revision))?;
            let held = snap.iter().find(|(k, _)| k == key).map(|(_, h)| h.clone());
            created = held.as_ref().map(|h| h.create_revision);
            let stored = held.map(|h| (h.value, Some(h.mod_revision)));
            (session, format!("etcd {} at revision {rev}", cfg.endpoints.join(",")), stored)
        }
    };
    let db = explain::Db::of_session(&session);
    let e = match explain::explain(&db, key, value, why_not, explain::Options { depth }) {
        Ok(e) => e,
        Err(e @ (explain::ExplainError::UnknownKey(_) | explain::ExplainError::BadValue { .. })) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(1));
        }
        Err(e) => return Err(e.into()),
    };
    // A placement kept since an earlier round: why its node was chosen then,
    // from etcd as the round that wrote it saw it.
    let placed = match created {
        Some(created) if e.holds && !why_not && key.starts_with("placement/instance/") => Some(placement_origin(&program, etcd, key, value, created, depth)?),
        _ => None,
    };
    print_explanation(&e, &source, stored, placed, format)
}

/// Why a placement's node was chosen when it was placed: the explanation at
/// the revision its write was derived from (the `status/derived_revision`
/// the same transaction wrote), or why that can no longer be told.
fn placement_origin(
    program: &std::sync::Arc<ccattler_parser::Program>,
    etcd: &EtcdArgs,
    key: &str,
    value: Option<&str>,
    created: i64,
    depth: usize,
) -> anyhow::Result<Placed> {
    use ccattler_engine::explain;
    let cfg = etcd.config()?;
    let rt = runtime()?;
    let derived: Result<i64, String> = rt.block_on(async {
        let mut client = ccattler_store::etcd::connect(&cfg).await.map_err(|e| e.to_string())?;
        let resp = client.get("status/derived_revision", Some(etcd_client::GetOptions::new().with_revision(created))).await.map_err(|e| e.to_string())?;
        let kv = resp.kvs().first().ok_or("no status/derived_revision was written with it")?;
        let v = kv.value_str().map_err(|e| e.to_string())?;
        v.trim().parse::<i64>().map_err(|_| format!("status/derived_revision holds {v:?}"))
    });
    let derived = match derived {
        Ok(d) => d,
        Err(why) => return Ok(Placed { created, derived: None, explanation: Err(format!("written at revision {created}: {why}")) }),
    };
    let at = rt.block_on(ccattler_bridge::explain::snapshot_session(&cfg, program.clone(), Some(derived)));
    let explanation = match at {
        Ok((session, _, _)) => {
            let db = explain::Db::of_session(&session);
            explain::explain(&db, key, value, false, explain::Options { depth }).map_err(|e| e.to_string())
        }
        Err(e) => Err(format!("revision {derived} can no longer be read (etcd compacted it?): {e}")),
    };
    Ok(Placed { created, derived: Some(derived), explanation })
}

/// A kept placement's origin (see [`placement_origin`]).
struct Placed {
    created: i64,
    derived: Option<i64>,
    explanation: Result<ccattler_engine::explain::Explanation, String>,
}

/// Prints an explanation with where its facts came from and what the store
/// holds at the key (value, and mod_revision when known); exit 0 when the
/// asked fact holds, 1 when it does not.
fn print_explanation(
    e: &ccattler_engine::explain::Explanation,
    source: &str,
    stored: Option<(String, Option<i64>)>,
    placed: Option<Placed>,
    format: Format,
) -> anyhow::Result<ExitCode> {
    match format {
        Format::Text => {
            println!("# {source}");
            if let Some((v, rev)) = &stored {
                let at = rev.map(|r| format!(" (mod_revision {r})")).unwrap_or_default();
                println!("# the store holds {} = {v:?}{at}", e.key);
            }
            print!("{}", ccattler_engine::explain::render::text(e));
            if let Some(p) = &placed {
                let derived = p.derived.map(|d| format!(", derived from revision {d}")).unwrap_or_default();
                println!("\n# when it was placed: written at revision {}{derived}", p.created);
                match &p.explanation {
                    Ok(then) => print!("{}", ccattler_engine::explain::render::text(then)),
                    Err(why) => println!("# {why}"),
                }
            }
        }
        Format::Json => {
            let mut v = serde_json::to_value(e)?;
            v["source"] = serde_json::Value::String(source.to_string());
            v["stored"] = match stored {
                Some((value, rev)) => serde_json::json!({ "value": value, "mod_revision": rev }),
                None => serde_json::Value::Null,
            };
            if let Some(p) = placed {
                v["placed"] = match p.explanation {
                    Ok(then) => serde_json::json!({ "written_at": p.created, "derived_at": p.derived, "explanation": then }),
                    Err(why) => serde_json::json!({ "written_at": p.created, "derived_at": p.derived, "unavailable": why }),
                };
            }
            println!("{v}");
        }
    }
    Ok(if e.holds { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// `KEY` or `KEY=VALUE`.
fn split_asked(asked: &str) -> (&str, Option<&str>) {
    match asked.split_once('=') {
        Some((k, v)) => (k.trim(), Some(v.trim())),
        None => (asked.trim(), None),
    }
}

/// `explain --controller URL`: asks a controller's `/explain`.
fn explain_served(url: &str, asked: &str, why_not: bool, depth: usize, format: Format) -> anyhow::Result<ExitCode> {
    use ccattler_bridge::http::{encode_query, get};
    let hostport = url.strip_prefix("http://").unwrap_or(url).trim_end_matches('/');
    let (host, port) = hostport.rsplit_once(':').ok_or_else(|| anyhow::anyhow!("--controller {url:?} is not http://HOST:PORT"))?;
    let port: u16 = port.parse().map_err(|_| anyhow::anyhow!("--controller {url:?}: {port:?} is not a port"))?;
    let (key, value) = split_asked(asked);
    let mut path = format!("/explain?key={}&depth={depth}&why_not={why_not}", encode_query(key));
    if let Some(v) = value {
        path += &format!("&value={}", encode_query(v));
    }
    let (status, body) = runtime()?.block_on(get(host, port, &path)).ok_or_else(|| anyhow::anyhow!("no answer from the controller at {url}"))?;
    let body = String::from_utf8_lossy(&body);
    if status.as_u16() == 404 {
        eprintln!("error: {}", body.trim_end());
        return Ok(ExitCode::from(1));
    }
    if !status.is_success() {
        anyhow::bail!("the controller at {url} answered {status}: {}", body.trim_end());
    }
    let e: ccattler_engine::explain::Explanation = serde_json::from_str(&body)?;
    print_explanation(&e, &format!("controller {url} at revision {}", e.revision), None, None, format)
}

/// `*.test` files under the given paths (default `<rules>/tests`), sorted.
fn test_files(paths: Vec<PathBuf>, rules: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let paths = if paths.is_empty() { rules.iter().map(|r| r.join("tests")).filter(|t| t.is_dir()).collect() } else { paths };
    Ok(ccattler_parser::files_with_extension(&paths, "test")?)
}

fn test(paths: Vec<PathBuf>, rules: &[PathBuf], filter: Option<&str>, format: Format) -> anyhow::Result<ExitCode> {
    use ccattler_engine::ruletest;
    let Some(program) = load_program(rules)? else { return Ok(ExitCode::from(1)) };
    let mut results = Vec::new();
    for file in test_files(paths, rules)? {
        let text = std::fs::read_to_string(&file).map_err(|e| anyhow::anyhow!("{}: {e}", file.display()))?;
        let name = file.display().to_string();
        for case in ruletest::parse(&name, &text)? {
            if filter.is_some_and(|f| !case.name.contains(f)) {
                continue;
            }
            results.push(ruletest::run(&program, &case));
        }
    }
    let failed = results.iter().filter(|r| !r.passed()).count();
    match format {
        Format::Text => {
            for r in &results {
                if r.passed() {
                    println!("ok   {}:{}: {}", r.file, r.line, r.name);
                } else {
                    print!("{}", ruletest::render(r));
                }
            }
            println!("{} passed, {} failed", results.len() - failed, failed);
        }
        Format::Json => println!("{}", serde_json::json!({ "passed": results.len() - failed, "failed": failed, "cases": results })),
    }
    Ok(if failed == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// A panic anywhere in the daemon — an engine worker's included, where the
/// other workers would otherwise wait for it forever — is logged and ends the
/// process at once with exit code 70, so systemd restarts it and a standby
/// takes over, instead of a controller that spins and writes nothing.
fn exit_on_panic() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        tracing::error!(panic = %info, "a thread panicked; exiting so that a standby or a restart takes over");
        default(info);
        std::process::exit(70);
    }));
}

fn describe(what: Option<&str>, rules: &[PathBuf], format: Format) -> anyhow::Result<ExitCode> {
    use ccattler_parser::describe;
    let Some(program) = load_program(rules)? else { return Ok(ExitCode::from(1)) };
    let found = match what {
        None => describe::all(&program),
        Some(w) => match program.relation(w) {
            Some(rel) => vec![describe::relation(&program, rel)],
            None => describe::key(&program, w),
        },
    };
    if found.is_empty() {
        let w = what.unwrap_or_default();
        let names: Vec<&str> = program.relations.iter().map(|r| r.name.as_str()).filter(|n| !n.contains('#')).collect();
        let near = names.iter().map(|n| (ccattler_parser::check::edit_distance(n, w), *n)).min().filter(|(d, n)| *d <= 2.max(n.len() / 4));
        let hint = near.map(|(_, n)| format!("; did you mean {n}?")).unwrap_or_default();
        eprintln!("error: {w:?} is neither a relation nor a key any relation reads or writes{hint}");
        return Ok(ExitCode::from(1));
    }
    match format {
        Format::Text => {
            let texts: Vec<String> = found.iter().map(describe::render).collect();
            print!("{}", texts.join("\n"));
        }
        Format::Json => println!("{}", serde_json::to_string(&found)?),
    }
    Ok(ExitCode::SUCCESS)
}

fn usage_error(e: anyhow::Error) -> ExitCode {
    eprintln!("error: {e:#}");
    ExitCode::from(2)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_string()).unwrap_or_else(|_| "controller".into())
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().enable_all().build()?)
}

fn controller(cfg: ccattler_bridge::controller::ControllerConfig) -> anyhow::Result<ExitCode> {
    match runtime()?.block_on(ccattler_bridge::controller::run(cfg)) {
        Ok(()) => Ok(ExitCode::SUCCESS),
        Err(e @ ccattler_bridge::controller::ControllerError::Rules { .. }) => {
            eprintln!("{e}");
            Ok(ExitCode::from(1))
        }
        Err(e) => Err(e.into()),
    }
}

fn parse_resource(s: &str) -> Result<(String, i64), String> {
    let (k, v) = s.split_once('=').filter(|(k, _)| !k.is_empty()).ok_or_else(|| format!("{s:?} is not NAME=AMOUNT"))?;
    let amount = v.parse::<i64>().map_err(|_| format!("{s:?}: {v:?} is not a whole number"))?;
    Ok((k.to_string(), amount))
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.is_empty() => Ok((k.to_string(), v.to_string())),
        _ => Err(format!("{s:?} is not KEY=VALUE")),
    }
}

fn parse_networks(s: &str) -> Result<String, String> {
    ccattler_parser::ast::check_networks(s)?;
    Ok(s.split(',').map(str::trim).collect::<Vec<_>>().join(","))
}

fn agent(cfg: ccattler_agent::AgentConfig) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let agent = match ccattler_agent::Agent::new(cfg) {
            Ok(a) => a,
            Err(e) => return Ok(usage_error(e.into())),
        };
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let stop = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        };
        agent.run(stop).await?;
        Ok(ExitCode::SUCCESS)
    })
}

fn serve_http(instance: String) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(ccattler_agent::http_image::serve(instance))?;
    Ok(ExitCode::SUCCESS)
}

fn plan(etcd: &EtcdArgs, rules: &[PathBuf]) -> anyhow::Result<ExitCode> {
    use ccattler_bridge::{etcd as e, Op, Reconciler};
    let Some(program) = load_program(rules)? else { return Ok(ExitCode::from(1)) };
    let cfg = etcd.config()?;
    let (rev, snap) = runtime()?.block_on(async {
        let mut client = e::connect(&cfg).await?;
        e::snapshot(&mut client, &ccattler_bridge::controller::prefixes(&program), 5000).await
    })?;
    let mut r = Reconciler::new(program, 1)?;
    r.rebase(rev as u64, snap)?;
    let ops = r.full_plan();
    println!("# plan against etcd revision {rev}: {} write(s)", ops.len());
    for op in &ops {
        match op {
            Op::Create { key, value } => println!("+ {key} = {}", ccattler_engine::factfile::format_value(value)),
            Op::Update { key, value, .. } => {
                let old = r.held(key).map(|h| h.value.clone()).unwrap_or_default();
                println!("~ {key} = {} (was {})", ccattler_engine::factfile::format_value(value), ccattler_engine::factfile::format_value(&old));
            }
            Op::Delete { key, .. } => println!("- {key}"),
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// `plan --with FILE`: the derived keys at the fixed point of the current
/// state, against those at the fixed point with FILE's changes applied.
fn what_if(etcd: &EtcdArgs, rules: &[PathBuf], with: &std::path::Path, facts: Option<&std::path::Path>) -> anyhow::Result<ExitCode> {
    let Some(program) = load_program(rules)? else { return Ok(ExitCode::from(1)) };
    let changes = read_changes(with)?;
    // Hypothetical values the controller would reject are named first.
    let mut rejected = 0;
    for (line, key, value) in &changes {
        if let (Some(v), Some(ccattler_engine::facts::Lint::Rejected(why))) =
            (value, value.as_ref().and_then(|v| ccattler_engine::facts::lint(&program, key, v)))
        {
            eprintln!("warning: {}:{line}: {key} = {v:?} would be rejected: {why}", with.display());
            rejected += 1;
        }
    }
    let (mut session, source) = match facts {
        Some(path) => (session_from_facts(program.clone(), path, ccattler_engine::default_workers())?.0, format!("facts file {}", path.display())),
        None => {
            let cfg = etcd.config()?;
            let (mut s, rev, _) = runtime()?.block_on(ccattler_bridge::explain::snapshot_session(&cfg, program.clone(), None))?;
            s.write(&[])?; // to the fixed point the controller would reach
            (s, format!("etcd revision {rev}"))
        }
    };
    let before = session.derived().clone();
    let writes: Vec<(String, Option<String>)> = changes.iter().map(|(_, k, v)| (k.clone(), v.clone())).collect();
    session.write(&writes)?;
    let after = session.derived();
    let mut diff = Vec::new();
    for (k, v) in after {
        match before.get(k) {
            None => diff.push(format!("+ {k} = {}", ccattler_engine::factfile::format_value(v))),
            Some(old) if old != v => {
                diff.push(format!("~ {k} = {} (was {})", ccattler_engine::factfile::format_value(v), ccattler_engine::factfile::format_value(old)))
            }
            Some(_) => {}
        }
    }
    for k in before.keys().filter(|k| !after.contains_key(*k)) {
        diff.push(format!("- {k}"));
    }
    diff.sort_by(|a, b| a[2..].cmp(&b[2..]));
    println!("# what if {} ({} change(s), {rejected} rejected) against {source}: {} derived key(s) change", with.display(), changes.len(), diff.len());
    for d in &diff {
        println!("{d}");
    }
    Ok(ExitCode::SUCCESS)
}

/// A changes file: `KEY = VALUE` puts (facts-file rules) and `- KEY`
/// deletes, `#` comments; each with its line.
fn read_changes(path: &std::path::Path) -> anyhow::Result<Vec<(usize, String, Option<String>)>> {
    let text = std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    let mut puts = String::new();
    for (i, raw) in text.lines().enumerate() {
        match raw.trim().strip_prefix("- ") {
            Some(key) if !key.contains(" = ") => {
                out.push((i + 1, key.trim().to_string(), None));
                puts.push('\n');
            }
            _ => {
                puts.push_str(raw);
                puts.push('\n');
            }
        }
    }
    for f in ccattler_engine::factfile::parse(&path.display().to_string(), &puts)? {
        out.push((f.line, f.key, Some(f.value)));
    }
    out.sort_by_key(|c| c.0);
    Ok(out)
}

/// Prefixes a writer may write with `apply` (DESIGN §6): the user writes
/// `desired/` and `intent/user/`; any other writer only its own `intent/<writer>/`.
fn writer_prefixes(writer: &str) -> Vec<String> {
    if writer == "user" {
        vec!["desired/".into(), "intent/user/".into()]
    } else {
        vec![format!("intent/{writer}/")]
    }
}

/// Checks a facts file's keys and values against the rules' inputs:
/// (errors: values that would be rejected; warnings: keys no input reads).
fn lint_facts(program: &ccattler_parser::Program, file: &std::path::Path, facts: &[ccattler_engine::factfile::FactLine]) -> (Vec<String>, Vec<String>) {
    use ccattler_engine::facts::{lint, Lint};
    let (mut errors, mut warnings) = (Vec::new(), Vec::new());
    for f in facts {
        match lint(program, &f.key, &f.value) {
            None => {}
            Some(Lint::Rejected(why)) => errors.push(format!("error: {}:{}: {}: {why}", file.display(), f.line, f.key)),
            Some(Lint::Unread { near }) => {
                let hint = near.map(|n| format!("; did you mean {n}?")).unwrap_or_default();
                warnings.push(format!("warning: {}:{}: no rule reads {}{hint}", file.display(), f.line, f.key));
            }
        }
    }
    (errors, warnings)
}

/// Keys of a facts file a policy of the rules denies: the rules run over the
/// file's facts alone, and a derived `status/denied/KEY` names a KEY of the
/// file and why (rules/policy.rules). Empty when no rule writes under
/// `status/denied/`.
fn policy_denials(
    program: &std::sync::Arc<ccattler_parser::Program>,
    file: &std::path::Path,
    facts: &[ccattler_engine::factfile::FactLine],
) -> anyhow::Result<Vec<String>> {
    const DENIED: &str = "status/denied/";
    let has_policy = program.outputs().any(|(_, r)| r.pattern.as_ref().is_some_and(|p| p.text.starts_with(DENIED)));
    if !has_policy || facts.is_empty() {
        return Ok(Vec::new());
    }
    let mut session = ccattler_engine::Session::new(program.clone(), 1)?;
    let writes: Vec<(String, Option<String>)> = facts.iter().map(|f| (f.key.clone(), Some(f.value.clone()))).collect();
    session.write(&writes)?;
    Ok(facts
        .iter()
        .filter_map(|f| {
            let why = session.derived().get(&format!("{DENIED}{}", f.key))?;
            Some(format!("error: {}:{}: {}: denied by policy: {why}", file.display(), f.line, f.key))
        })
        .collect())
}

/// Operations etcd takes in one transaction by default (`--max-txn-ops`).
const APPLY_TXN_OPS: usize = 128;
/// Bytes a transaction of `apply` may carry (under `--max-request-bytes`).
const APPLY_TXN_BYTES: usize = 1 << 20;

fn apply(file: &std::path::Path, writer: &str, rules: &[PathBuf], etcd: &EtcdArgs) -> anyhow::Result<ExitCode> {
    if !ccattler_parser::pattern::is_valid_name(writer) {
        return Ok(usage_error(anyhow::anyhow!("--writer {writer:?} is not a name")));
    }
    let prefixes = writer_prefixes(writer);
    let allowed = prefixes.join(" or ");
    let facts = read_facts(file)?;
    // Everything is checked before anything is written: the writer's
    // prefixes, then every key and value against the rules' inputs.
    let refused: Vec<String> = facts
        .iter()
        .filter(|f| !prefixes.iter().any(|p| f.key.starts_with(p.as_str())))
        .map(|f| format!("{}:{}: {} is not under {allowed}", file.display(), f.line, f.key))
        .collect();
    if !refused.is_empty() {
        for r in &refused {
            eprintln!("error: {r}");
        }
        eprintln!("nothing written: writer {writer} may write only {allowed}");
        return Ok(ExitCode::from(1));
    }
    let Some(program) = load_program(rules)? else { return Ok(ExitCode::from(1)) };
    let (errors, warnings) = lint_facts(&program, file, &facts);
    for w in &warnings {
        eprintln!("{w}");
    }
    if !errors.is_empty() {
        for e in &errors {
            eprintln!("{e}");
        }
        eprintln!("nothing written: {} value(s) the controller would reject", errors.len());
        return Ok(ExitCode::from(1));
    }
    let denied = policy_denials(&program, file, &facts)?;
    if !denied.is_empty() {
        for d in &denied {
            eprintln!("{d}");
        }
        eprintln!("nothing written: {} key(s) the rules' policy denies", denied.len());
        return Ok(ExitCode::from(1));
    }
    let bytes: usize = facts.iter().map(|f| f.key.len() + f.value.len() + 16).sum();
    let whole = facts.len() <= APPLY_TXN_OPS && bytes <= APPLY_TXN_BYTES;
    if !whole {
        eprintln!("note: {} fact(s), {bytes} bytes: more than one transaction holds, so the file is written in parts", facts.len());
    }
    let cfg = etcd.config()?;
    let written = runtime()?.block_on(async {
        let mut client = ccattler_store::etcd::connect(&cfg).await?;
        let mut last = 0;
        // In one transaction when it fits: the file is applied whole or not at all.
        let (mut chunk, mut size) = (Vec::new(), 0);
        for f in facts.iter() {
            let b = f.key.len() + f.value.len() + 16;
            if !chunk.is_empty() && (chunk.len() == APPLY_TXN_OPS || size + b > APPLY_TXN_BYTES) {
                let resp = client.txn(etcd_client::Txn::new().and_then(std::mem::take(&mut chunk))).await?;
                last = resp.header().map_or(0, |h| h.revision());
                size = 0;
            }
            size += b;
            chunk.push(etcd_client::TxnOp::put(f.key.as_str(), f.value.as_str(), None));
        }
        if !chunk.is_empty() {
            let resp = client.txn(etcd_client::Txn::new().and_then(chunk)).await?;
            last = resp.header().map_or(0, |h| h.revision());
        }
        Ok::<_, etcd_client::Error>(last)
    });
    let revision = match written {
        Ok(rev) => rev,
        Err(e) if ccattler_store::auth::is_permission_denied(&e) => {
            let who = cfg.user.as_ref().map_or("this etcd user".to_string(), |(u, _)| format!("etcd user {u}"));
            eprintln!("error: etcd refused the write: {who} may not write these keys (each user writes only its own prefixes, DESIGN §6); nothing written");
            return Ok(ExitCode::from(1));
        }
        Err(e) => return Err(e.into()),
    };
    println!("applied {} fact(s) from {} at revision {revision}", facts.len(), file.display());
    Ok(ExitCode::SUCCESS)
}

fn rollout_status(service: &str, watch: bool, timeout: u64, etcd: &EtcdArgs) -> anyhow::Result<ExitCode> {
    if !ccattler_parser::pattern::is_valid_name(service) {
        return Ok(usage_error(anyhow::anyhow!("{service:?} is not a service name")));
    }
    let cfg = etcd.config()?;
    runtime()?.block_on(async {
        let mut client = ccattler_store::etcd::connect(&cfg).await?;
        let until = std::time::Instant::now() + std::time::Duration::from_secs(timeout);
        let mut shown = String::new();
        loop {
            let prefix = format!("status/rollout/{service}/");
            let resp = client.get(prefix.as_str(), Some(etcd_client::GetOptions::new().with_prefix())).await?;
            let field =
                |f: &str| resp.kvs().iter().find(|kv| kv.key() == format!("{prefix}{f}").as_bytes()).map(|kv| String::from_utf8_lossy(kv.value()).into_owned());
            let Some(state) = field("state") else {
                eprintln!("{service}: no rollout status (is it a service with instances?)");
                return Ok(ExitCode::from(1));
            };
            let want = client.get(format!("effective/service/{service}/instances"), None).await?;
            let want = want.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned()).unwrap_or_else(|| "?".into());
            let line = format!(
                "{service}: generation {}, {}/{want} updated, {} ready, {state}",
                field("generation").unwrap_or_default(),
                field("updated").unwrap_or_default(),
                field("ready").unwrap_or_default()
            );
            if line != shown {
                println!("{line}");
                shown = line;
            }
            let done = state == "complete";
            if !watch || done {
                return Ok(if done || !watch { ExitCode::SUCCESS } else { ExitCode::from(1) });
            }
            if state.starts_with("stalled") || state == "paused" {
                return Ok(ExitCode::from(1));
            }
            if std::time::Instant::now() >= until {
                eprintln!("{service}: not complete after {timeout} s");
                return Ok(ExitCode::from(1));
            }
            tokio::time::sleep(std::time::Duration::from_millis(250)).await;
        }
    })
}

fn autoscaler(cfg: ccattler_bridge::autoscaler::AutoscalerConfig) -> anyhow::Result<ExitCode> {
    runtime()?.block_on(async {
        let (tx, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).expect("SIGTERM handler");
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            let _ = tx.send(true);
        });
        ccattler_bridge::autoscaler::run(cfg, rx).await?;
        Ok(ExitCode::SUCCESS)
    })
}

fn node(action: NodeAction, etcd: &EtcdArgs) -> anyhow::Result<ExitCode> {
    let name = match &action {
        NodeAction::Cordon { node } | NodeAction::Uncordon { node } | NodeAction::Drain { node, .. } => node.clone(),
    };
    if !ccattler_parser::pattern::is_valid_name(&name) {
        return Ok(usage_error(anyhow::anyhow!("{name:?} is not a node name ([a-z0-9]([a-z0-9._-]*[a-z0-9])?, at most 63 characters)")));
    }
    let key = |k: &str| format!("desired/node/{name}/{k}");
    let cfg = etcd.config()?;
    runtime()?.block_on(async {
        let mut client = ccattler_store::etcd::connect(&cfg).await?;
        let wait = match action {
            NodeAction::Cordon { .. } => {
                client.put(key("cordon"), "true", None).await?;
                println!("{name}: cordoned (nothing new is placed there; `ccattler node drain {name}` moves what runs there)");
                None
            }
            NodeAction::Uncordon { .. } => {
                let ops = vec![etcd_client::TxnOp::delete(key("cordon"), None), etcd_client::TxnOp::delete(key("drain"), None)];
                client.txn(etcd_client::Txn::new().and_then(ops)).await?;
                println!("{name}: uncordoned (it takes instances again)");
                None
            }
            NodeAction::Drain { wait, .. } => {
                client.put(key("drain"), "true", None).await?;
                println!("{name}: draining (watch `ccattler get effective/node/{name}/state`; `ccattler get status/drain/{name}/` says what holds it back)");
                wait
            }
        };
        let Some(seconds) = wait else { return Ok(ExitCode::SUCCESS) };
        let until = std::time::Instant::now() + std::time::Duration::from_secs(seconds);
        let mut shown = String::new();
        loop {
            let state = client.get(format!("effective/node/{name}/state"), None).await?;
            let state = state.kvs().first().map(|kv| String::from_utf8_lossy(kv.value()).into_owned()).unwrap_or_default();
            if state == "drained" {
                println!("{name}: drained");
                return Ok(ExitCode::SUCCESS);
            }
            let held = client.get(format!("status/drain/{name}/"), Some(etcd_client::GetOptions::new().with_prefix())).await?;
            let now: String = held.kvs().iter().map(|kv| format!("  {}\n", String::from_utf8_lossy(kv.value()))).collect();
            if now != shown {
                print!("{now}");
                shown = now;
            }
            if std::time::Instant::now() >= until {
                eprintln!("{name}: still {state} after {seconds} s");
                return Ok(ExitCode::from(1));
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
    })
}

fn get(prefix: &str, etcd: &EtcdArgs, format: Format) -> anyhow::Result<ExitCode> {
    let cfg = etcd.config()?;
    let (rev, kvs) = runtime()?.block_on(async {
        let mut client = ccattler_store::etcd::connect(&cfg).await?;
        let whole = [prefix.to_string()];
        match ccattler_store::etcd::snapshot(&mut client, &whole, 10_000).await {
            // Everything, as a user who may not read all of it (`user`
            // reads all but `secret/`): the namespaces it may read, at one
            // revision.
            Err(e) if prefix.is_empty() && ccattler_store::auth::is_permission_denied(&e) => {
                let rev = ccattler_store::etcd::current_revision(&mut client).await?;
                let mut all = Vec::new();
                for ns in ccattler_store::auth::PUBLIC_NAMESPACES.iter().chain(["secret/"].iter()) {
                    match ccattler_store::etcd::snapshot_at(&mut client, &[ns.to_string()], 10_000, Some(rev)).await {
                        Ok((_, kvs)) => all.extend(kvs),
                        Err(e) if ccattler_store::auth::is_permission_denied(&e) => eprintln!("# {ns}: not readable as this user"),
                        Err(e) => return Err(e.into()),
                    }
                }
                anyhow::Ok((rev, all))
            }
            other => anyhow::Ok(other?),
        }
    })?;
    match format {
        Format::Text => {
            for (k, h) in &kvs {
                println!("{k} = {}", ccattler_engine::factfile::format_value(&h.value));
            }
        }
        Format::Json => {
            let facts: serde_json::Map<String, serde_json::Value> =
                kvs.iter().map(|(k, h)| (k.clone(), serde_json::json!({ "value": h.value, "mod_revision": h.mod_revision }))).collect();
            println!("{}", serde_json::json!({ "revision": rev, "facts": facts }));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The credentials file an `auth` command writes to.
fn credentials_file(etcd: &EtcdArgs) -> anyhow::Result<&std::path::Path> {
    etcd.credentials.as_deref().ok_or_else(|| anyhow::anyhow!("auth commands need --credentials FILE (the 0600 file passwords go to)"))
}

fn auth(action: AuthAction) -> anyhow::Result<ExitCode> {
    use ccattler_store::auth;
    let rt = runtime()?;
    match action {
        AuthAction::Bootstrap { etcd, secret_key } => {
            let file = credentials_file(&etcd)?;
            // Bootstrap talks to an etcd without auth: no user.
            let cfg = no_user(&etcd)?;
            if let Some(path) = &secret_key {
                if !path.exists() {
                    ccattler_store::seal::ClusterKeys::create(path)?;
                    eprintln!("created the cluster secret key {} (mode 0600)", path.display());
                }
            }
            let users = rt.block_on(async {
                let mut client = ccattler_store::etcd::connect(&cfg).await?;
                anyhow::Ok(auth::bootstrap(&mut client, file).await?)
            })?;
            eprintln!("created users {} (passwords in {}); auth is enabled", users.join(", "), file.display());
        }
        AuthAction::AddNode { node, address_range, etcd } => {
            let file = credentials_file(&etcd)?.to_path_buf();
            let cfg = etcd.config_as(Some(auth::ROOT))?;
            let user = rt.block_on(async {
                let mut client = ccattler_store::etcd::connect(&cfg).await?;
                let user = auth::add_node(&mut client, &node, &file).await?;
                if let Some(range) = &address_range {
                    client.put(format!("desired/node/{node}/address_range"), range.as_str(), None).await?;
                }
                anyhow::Ok(user)
            })?;
            eprintln!("created user {user}, confined to node {node}'s prefixes (password in {})", file.display());
            if let Some(range) = address_range {
                eprintln!("node {node}'s instances may be reached only inside {range}");
            }
        }
        AuthAction::RemoveNode { node, etcd } => {
            let cfg = etcd.config_as(Some(auth::ROOT))?;
            let user = rt.block_on(async {
                let mut client = ccattler_store::etcd::connect(&cfg).await?;
                anyhow::Ok(auth::remove_node(&mut client, &node).await?)
            })?;
            eprintln!("deleted user and role {user}");
        }
        AuthAction::Rotate { user, etcd } => {
            let file = credentials_file(&etcd)?.to_path_buf();
            let cfg = etcd.config_as(Some(auth::ROOT))?;
            rt.block_on(async {
                let mut client = ccattler_store::etcd::connect(&cfg).await?;
                anyhow::Ok(auth::rotate(&mut client, &user, &file).await?)
            })?;
            eprintln!("new password for {user} appended to {}", file.display());
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The connection without any user (TLS and endpoints only).
fn no_user(etcd: &EtcdArgs) -> anyhow::Result<ccattler_store::EtcdConfig> {
    let mut plain = etcd.clone();
    plain.credentials = None;
    plain.as_user = None;
    plain.etcd_user = None;
    plain.etcd_password = None;
    plain.config()
}

fn secret(action: SecretAction) -> anyhow::Result<ExitCode> {
    use ccattler_store::seal::ClusterKeys;
    use etcd_client::{Txn, TxnOp};
    let check_name = |name: &str| {
        if ccattler_parser::pattern::is_valid_name(name) {
            Ok(())
        } else {
            Err(anyhow::anyhow!("secret name {name:?} is not a name ([a-z0-9]([a-z0-9._-]*[a-z0-9])?, at most 63 characters)"))
        }
    };
    let rt = runtime()?;
    match action {
        SecretAction::Set { name, secret_key, etcd } => {
            if let Err(e) = check_name(&name) {
                return Ok(usage_error(e));
            }
            let keys = ClusterKeys::load(&secret_key)?;
            let mut value = zeroize::Zeroizing::new(Vec::new());
            std::io::Read::read_to_end(&mut std::io::stdin().lock(), &mut value).map_err(|e| anyhow::anyhow!("reading the value from stdin: {e}"))?;
            let sealed = match keys.seal(&name, &value) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("error: {e}; nothing written");
                    return Ok(ExitCode::from(1));
                }
            };
            let cfg = etcd.config()?;
            let rev = rt.block_on(async {
                let mut client = ccattler_store::etcd::connect(&cfg).await?;
                let txn = Txn::new().and_then([
                    TxnOp::put(format!("{}{name}", ccattler_store::layout::SECRET_VALUE), sealed, None),
                    TxnOp::put(format!("desired/secret/{name}"), ccattler_store::seal::value_tag(), None),
                ]);
                let resp = client.txn(txn).await?;
                anyhow::Ok(resp.header().map_or(0, |h| h.revision()))
            })?;
            eprintln!("secret {name} sealed with key {} and stored at revision {rev}", keys.current_id());
        }
        SecretAction::Rm { name, etcd } => {
            if let Err(e) = check_name(&name) {
                return Ok(usage_error(e));
            }
            let cfg = etcd.config()?;
            rt.block_on(async {
                let mut client = ccattler_store::etcd::connect(&cfg).await?;
                let txn = Txn::new().and_then([
                    TxnOp::delete(format!("{}{name}", ccattler_store::layout::SECRET_VALUE), None),
                    TxnOp::delete(format!("desired/secret/{name}"), None),
                ]);
                client.txn(txn).await?;
                anyhow::Ok(())
            })?;
            eprintln!("secret {name} removed");
        }
        SecretAction::Reseal { secret_key, etcd } => {
            let keys = ClusterKeys::load(&secret_key)?;
            let cfg = etcd.config()?;
            let (done, failed) = rt.block_on(async {
                let mut client = ccattler_store::etcd::connect(&cfg).await?;
                let prefix = [ccattler_store::layout::SECRET_VALUE.to_string()];
                let (_, values) = ccattler_store::etcd::snapshot(&mut client, &prefix, 1000).await?;
                let (mut done, mut failed) = (0, 0);
                for (key, held) in values {
                    let Some(name) = ccattler_store::layout::secret_value_name(&key) else { continue };
                    if ClusterKeys::sealed_with(&held.value) == Some(keys.current_id()) {
                        continue;
                    }
                    let resealed = keys.open(name, &held.value).and_then(|plain| keys.seal(name, &plain));
                    let sealed = match resealed {
                        Ok(s) => s,
                        Err(e) => {
                            eprintln!("error: {e}");
                            failed += 1;
                            continue;
                        }
                    };
                    // Only if nobody changed it meanwhile.
                    let cmp = etcd_client::Compare::mod_revision(key.as_str(), etcd_client::CompareOp::Equal, held.mod_revision);
                    if client.txn(Txn::new().when([cmp]).and_then([TxnOp::put(key.as_str(), sealed, None)])).await?.succeeded() {
                        done += 1;
                    } else {
                        eprintln!("error: {key} changed while being resealed; run reseal again");
                        failed += 1;
                    }
                }
                anyhow::Ok((done, failed))
            })?;
            eprintln!("{done} secret(s) sealed again with key {}; {failed} failed", keys.current_id());
            if failed > 0 {
                return Ok(ExitCode::from(1));
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}
