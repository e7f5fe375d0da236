//! The cluster as an operator reads it: tables of nodes, services,
//! instances, pending instances and rollouts, made from the keys etcd holds
//! (`ccattler status` reads them from etcd; the controller's console from its
//! warm state, the same keys).

use std::collections::BTreeMap;

/// Which table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum View {
    Nodes,
    Services,
    Instances,
    Pending,
    Rollouts,
}

/// One table: a title, its columns, its rows.
pub struct Table {
    pub title: &'static str,
    pub columns: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
}

impl Table {
    /// Aligned columns, as `kubectl get` prints them.
    pub fn text(&self) -> String {
        let mut widths: Vec<usize> = self.columns.iter().map(|c| c.len()).collect();
        for r in &self.rows {
            for (w, cell) in widths.iter_mut().zip(r) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: Vec<&str>| {
            let n = cells.len();
            let mut s: String = cells.iter().enumerate().map(|(i, c)| if i + 1 == n { c.to_string() } else { format!("{c:<w$}  ", w = widths[i]) }).collect();
            s.truncate(s.trim_end().len());
            s + "\n"
        };
        let mut out = line(self.columns.clone());
        for r in &self.rows {
            out += &line(r.iter().map(String::as_str).collect());
        }
        out
    }

    /// `{table, rows: [{column: value}]}`.
    pub fn json(&self) -> serde_json::Value {
        let rows: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|r| serde_json::Value::Object(self.columns.iter().zip(r).map(|(c, v)| (c.to_lowercase().replace(' ', "_"), serde_json::json!(v))).collect()))
            .collect();
        serde_json::json!({ "table": self.title, "rows": rows })
    }
}

/// The keys the tables are made of.
pub struct Cluster {
    kv: BTreeMap<String, String>,
}

/// Orders names with their numbers as numbers (`web-2` before `web-10`).
pub fn natural(a: &str, b: &str) -> std::cmp::Ordering {
    let key = |s: &str| -> Vec<(String, u64)> {
        let mut out = Vec::new();
        let mut text = String::new();
        let mut digits = String::new();
        for c in s.chars() {
            if c.is_ascii_digit() {
                digits.push(c);
            } else {
                if !digits.is_empty() {
                    out.push((std::mem::take(&mut text), digits.parse().unwrap_or(u64::MAX)));
                    digits.clear();
                }
                text.push(c);
            }
        }
        out.push((text, digits.parse().unwrap_or(0)));
        out
    };
    key(a).cmp(&key(b)).then_with(|| a.cmp(b))
}

impl Cluster {
    pub fn of(kv: BTreeMap<String, String>) -> Cluster {
        Cluster { kv }
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.kv.get(key).map(String::as_str)
    }

    fn or_dash(&self, key: &str) -> String {
        self.get(key).unwrap_or("-").to_string()
    }

    /// (rest of the key after `prefix`, value), for every key under it.
    fn under<'a>(&'a self, prefix: &'a str) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        self.kv.range(prefix.to_string()..).take_while(move |(k, _)| k.starts_with(prefix)).map(move |(k, v)| (&k[prefix.len()..], v.as_str()))
    }

    /// Names with a key `PREFIX{name}/SUFFIX`.
    fn names(&self, prefix: &str, suffix: &str) -> Vec<String> {
        let mut names: Vec<String> =
            self.under(prefix).filter_map(|(rest, _)| rest.split_once('/').filter(|(_, s)| *s == suffix).map(|(n, _)| n.to_string())).collect();
        names.sort_by(|a, b| natural(a, b));
        names.dedup();
        names
    }

    fn int(&self, key: &str) -> i64 {
        self.get(key).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
    }

    pub fn tables(&self, view: Option<View>, wide: bool) -> Vec<Table> {
        match view {
            None => vec![self.summary()],
            Some(View::Nodes) => vec![self.nodes(wide)],
            Some(View::Services) => vec![self.services(wide)],
            Some(View::Instances) => vec![self.instances(wide)],
            Some(View::Pending) => vec![self.pending()],
            Some(View::Rollouts) => vec![self.rollouts()],
        }
    }

    /// Instance → (node, service), from the per-node placement keys.
    fn placed(&self) -> BTreeMap<&str, (&str, &str)> {
        self.under("placement/node/").filter_map(|(rest, service)| rest.split_once('/').map(|(node, i)| (i, (node, service)))).collect()
    }

    pub fn summary(&self) -> Table {
        let nodes = self.names("effective/node/", "state");
        let mut by_state: BTreeMap<String, usize> = BTreeMap::new();
        for n in &nodes {
            *by_state.entry(self.or_dash(&format!("effective/node/{n}/state"))).or_default() += 1;
        }
        let instances = self.names("effective/instance/", "service");
        let mut inst_state: BTreeMap<String, usize> = BTreeMap::new();
        for i in &instances {
            *inst_state.entry(self.get(&format!("effective/instance/{i}/state")).unwrap_or("pending").to_string()).or_default() += 1;
        }
        let pending = self.under("status/unplaced/").count();
        let services = self.names("effective/service/", "instances");
        let rolling = self.names("status/rollout/", "state").iter().filter(|s| self.get(&format!("status/rollout/{s}/state")) != Some("complete")).count();
        let count = |m: &BTreeMap<String, usize>| m.iter().map(|(k, v)| format!("{v} {k}")).collect::<Vec<_>>().join(", ");
        Table {
            title: "summary",
            columns: vec!["WHAT", "COUNT", "DETAIL"],
            rows: vec![
                vec!["nodes".into(), nodes.len().to_string(), count(&by_state)],
                vec!["services".into(), services.len().to_string(), format!("{rolling} rolling out")],
                vec!["instances".into(), instances.len().to_string(), count(&inst_state)],
                vec!["pending".into(), pending.to_string(), if pending > 0 { "ccattler status pending".into() } else { String::new() }],
            ],
        }
    }

    pub fn nodes(&self, wide: bool) -> Table {
        let placed = self.placed();
        let mut on: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for (i, (n, _)) in &placed {
            on.entry(n).or_default().push(i);
        }
        let mut columns = vec!["NAME", "STATE", "CPU", "MEMORY", "INSTANCES"];
        if wide {
            columns.extend(["ADDRESS", "LABELS"]);
        }
        let rows = self
            .names("effective/node/", "state")
            .into_iter()
            .map(|n| {
                let instances = on.get(n.as_str()).cloned().unwrap_or_default();
                let used = |r: &str| -> i64 { instances.iter().map(|i| self.int(&format!("effective/service/{}/{r}", placed[i].1))).sum() };
                let of = |r: &str| format!("{}/{}", used(r), self.or_dash(&format!("observed/node/{n}/{r}")));
                let mut row = vec![n.clone(), self.or_dash(&format!("effective/node/{n}/state")), of("cpu"), of("memory"), instances.len().to_string()];
                if wide {
                    let labels: Vec<String> = self.under(&format!("desired/node/{n}/label/")).map(|(k, v)| format!("{k}={v}")).collect();
                    row.push(self.or_dash(&format!("observed/node/{n}/address")));
                    row.push(if labels.is_empty() { "-".into() } else { labels.join(",") });
                }
                row
            })
            .collect();
        Table { title: "nodes", columns, rows }
    }

    pub fn services(&self, wide: bool) -> Table {
        let placed = self.placed();
        let mut columns = vec!["NAME", "WANTED", "PLACED", "RUNNING", "READY", "ROLLOUT"];
        if wide {
            columns.extend(["IMAGE", "INTENT"]);
        }
        let rows = self
            .names("effective/service/", "instances")
            .into_iter()
            .map(|s| {
                let of_s: Vec<&str> = placed.iter().filter(|(_, (_, svc))| *svc == s).map(|(i, _)| *i).collect();
                let running = of_s.iter().filter(|i| self.get(&format!("effective/instance/{i}/state")) == Some("running")).count();
                let ready = self.under(&format!("endpoint/service/{s}/")).count();
                let mut row = vec![
                    s.clone(),
                    self.or_dash(&format!("effective/service/{s}/instances")),
                    of_s.len().to_string(),
                    running.to_string(),
                    ready.to_string(),
                    self.or_dash(&format!("status/rollout/{s}/state")),
                ];
                if wide {
                    let intents: Vec<String> = self
                        .under("intent/")
                        .filter_map(|(rest, v)| {
                            let (writer, rest) = rest.split_once('/')?;
                            (rest == format!("service/{s}/instances")).then(|| format!("{writer}={v}"))
                        })
                        .collect();
                    row.push(self.or_dash(&format!("effective/service/{s}/image")));
                    row.push(intents.join(","));
                }
                row
            })
            .collect();
        Table { title: "services", columns, rows }
    }

    pub fn instances(&self, wide: bool) -> Table {
        let mut columns = vec!["NAME", "SERVICE", "NODE", "STATE", "HEALTH"];
        if wide {
            columns.extend(["VERSION", "ENDPOINT", "RESTARTS"]);
        }
        let rows = self
            .names("effective/instance/", "service")
            .into_iter()
            .map(|i| {
                let service = self.or_dash(&format!("effective/instance/{i}/service"));
                let node = self.get(&format!("placement/instance/{i}")).map(String::from);
                let state = match (&node, self.get(&format!("effective/instance/{i}/state"))) {
                    (None, _) => "pending".to_string(),
                    (_, Some(s)) => s.to_string(),
                    (_, None) => "placed".to_string(),
                };
                let mut row = vec![
                    i.clone(),
                    service.clone(),
                    node.clone().unwrap_or_else(|| "-".into()),
                    state,
                    self.or_dash(&format!("effective/instance/{i}/health")),
                ];
                if wide {
                    row.push(self.or_dash(&format!("effective/instance/{i}/version")));
                    row.push(self.or_dash(&format!("endpoint/service/{service}/{i}")));
                    row.push(node.map_or("-".into(), |n| self.or_dash(&format!("observed/node/{n}/instance/{i}/restarts"))));
                }
                row
            })
            .collect();
        Table { title: "instances", columns, rows }
    }

    pub fn pending(&self) -> Table {
        let mut rows: Vec<Vec<String>> = self
            .under("status/unplaced/")
            .map(|(i, why)| vec![i.to_string(), self.or_dash(&format!("effective/instance/{i}/service")), why.to_string()])
            .collect();
        rows.sort_by(|a, b| natural(&a[0], &b[0]));
        Table { title: "pending", columns: vec!["INSTANCE", "SERVICE", "REASON"], rows }
    }

    pub fn rollouts(&self) -> Table {
        let rows = self
            .names("status/rollout/", "state")
            .into_iter()
            .map(|s| {
                let f = |x: &str| self.or_dash(&format!("status/rollout/{s}/{x}"));
                vec![
                    s.clone(),
                    f("generation"),
                    format!("{}/{}", f("updated"), self.or_dash(&format!("effective/service/{s}/instances"))),
                    f("ready"),
                    f("state"),
                ]
            })
            .collect();
        Table { title: "rollouts", columns: vec!["SERVICE", "GENERATION", "UPDATED", "READY", "STATE"], rows }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(lines: &str) -> Cluster {
        Cluster::of(lines.lines().filter_map(|l| l.split_once(" = ")).map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    #[test]
    fn tables_sum_requests_per_node_and_count_per_service() {
        let c = cluster(
            "effective/node/node-1/state = ready\nobserved/node/node-1/cpu = 4000\nobserved/node/node-1/memory = 8192\n\
             effective/node/node-10/state = unreachable\nobserved/node/node-10/cpu = 1000\n\
             effective/node/node-2/state = ready\nobserved/node/node-2/cpu = 2000\n\
             effective/service/web/instances = 3\neffective/service/web/cpu = 500\neffective/service/web/memory = 256\n\
             placement/node/node-1/web-0 = web\nplacement/node/node-1/web-1 = web\n\
             effective/instance/web-0/service = web\neffective/instance/web-0/state = running\n\
             effective/instance/web-1/service = web\neffective/instance/web-1/state = crashed\neffective/instance/web-2/service = web\n\
             placement/instance/web-0 = node-1\nplacement/instance/web-1 = node-1\n\
             endpoint/service/web/web-0 = 127.0.0.11:80\nstatus/unplaced/web-2 = no node it may use has room\n\
             status/rollout/web/state = complete\nintent/user/service/web/instances = 3\n",
        );
        let nodes = c.nodes(false);
        assert_eq!(nodes.rows.iter().map(|r| r[0].as_str()).collect::<Vec<_>>(), ["node-1", "node-2", "node-10"], "natural order");
        assert_eq!(nodes.rows[0], ["node-1", "ready", "1000/4000", "512/8192", "2"]);
        let services = c.services(true);
        assert_eq!(services.rows[0], ["web", "3", "2", "1", "1", "complete", "-", "user=3"]);
        let instances = c.instances(false);
        assert_eq!(instances.rows[2], ["web-2", "web", "-", "pending", "-"]);
        assert_eq!(c.pending().rows, [["web-2", "web", "no node it may use has room"]]);
        let text = nodes.text();
        assert!(text.starts_with("NAME     STATE        CPU        MEMORY    INSTANCES\n"), "{text}");
        assert_eq!(services.json()["rows"][0]["wanted"], "3");
        assert_eq!(c.summary().rows[2][2], "1 crashed, 1 pending, 1 running");
    }
}
