//! ccattler status: the cluster as tables, as `kubectl get` and `nomad
//! status` print it — read from etcd at one revision, as the user.

#[allow(unused_imports)]
use crate::prelude::*;
use ccattler_bridge::view::{Cluster, Table};

/// Which table.
#[derive(Clone, Copy, Debug, clap::ValueEnum, PartialEq, Eq)]
pub(crate) enum View {
    Nodes,
    Services,
    Instances,
    Pending,
    Rollouts,
}

impl From<View> for ccattler_bridge::view::View {
    fn from(v: View) -> Self {
        use ccattler_bridge::view::View as V;
        match v {
            View::Nodes => V::Nodes,
            View::Services => V::Services,
            View::Instances => V::Instances,
            View::Pending => V::Pending,
            View::Rollouts => V::Rollouts,
        }
    }
}

/// `-o wide`: more columns.
#[derive(Clone, Copy, Debug, clap::ValueEnum, PartialEq, Eq)]
pub(crate) enum Output {
    Wide,
}

/// What the user reads of the cluster (every namespace but `secret/`).
const PREFIXES: [&str; 7] = ["desired/", "intent/", "observed/", "effective/", "placement/", "endpoint/", "status/"];

pub(crate) fn status(view: Option<View>, watch: bool, output: Option<Output>, format: Format, etcd: &EtcdArgs) -> anyhow::Result<ExitCode> {
    let cfg = etcd.config()?;
    let wide = output == Some(Output::Wide);
    runtime()?.block_on(async {
        let mut client = ccattler_store::etcd::connect(&cfg).await?;
        let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
        loop {
            let prefixes: Vec<String> = PREFIXES.iter().map(|p| p.to_string()).collect();
            let (rev, snap) = ccattler_store::etcd::snapshot(&mut client, &prefixes, 5000).await?;
            let cluster = Cluster::of(snap.into_iter().map(|(k, h)| (k, h.value)).collect());
            let tables = cluster.tables(view.map(Into::into), wide);
            let text = match format {
                Format::Json => serde_json::json!({ "revision": rev, "tables": tables.iter().map(Table::json).collect::<Vec<_>>() }).to_string() + "\n",
                Format::Text => tables.iter().map(Table::text).collect::<Vec<_>>().join("\n"),
            };
            if watch && tty {
                print!("\x1b[2J\x1b[H"); // a fresh screen each time, as `watch` does
            }
            if watch && format == Format::Text {
                println!("# as of revision {rev}");
            }
            print!("{text}");
            if !watch {
                let empty = view.is_some() && tables.iter().all(|t| t.rows.is_empty());
                if empty && format == Format::Text {
                    eprintln!("(none)");
                }
                return Ok(ExitCode::SUCCESS);
            }
            next_change(&cfg, rev).await?;
        }
    })
}

/// Waits until anything the tables show changes after `rev` (then a moment
/// more, so a burst of writes is one redraw).
async fn next_change(cfg: &ccattler_store::EtcdConfig, rev: i64) -> anyhow::Result<()> {
    let client = ccattler_store::etcd::connect(cfg).await?;
    // Two ranges: desired/ … placement/ (desired, effective, endpoint,
    // intent, observed, placement), and status/ — not secret/ between them.
    let ranges = [("desired/", "placement0"), ("status/", "status0")];
    let mut streams = Vec::new();
    for (from, to) in ranges {
        let opts = etcd_client::WatchOptions::new().with_range(to).with_start_revision(rev + 1);
        let (watcher, stream) = ccattler_store::etcd::watch(&client, from, opts).await?;
        streams.push((watcher, stream));
    }
    let (mut a, mut b) = (streams.remove(0), streams.remove(0));
    tokio::select! {
        m = a.1.message() => { m?; }
        m = b.1.message() => { m?; }
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    Ok(())
}
