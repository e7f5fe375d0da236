//! ccattler explain: why a derived fact holds, or why not.

#[allow(unused_imports)]
use crate::prelude::*;

#[allow(clippy::too_many_arguments)]
pub(crate) fn explain(
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
    let Some(program) = load_program_for(rules, etcd)? else { return Ok(ExitCode::from(1)) };
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
pub(crate) fn placement_origin(
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
pub(crate) struct Placed {
    created: i64,
    derived: Option<i64>,
    explanation: Result<ccattler_engine::explain::Explanation, String>,
}

/// Prints an explanation with where its facts came from and what the store
/// holds at the key (value, and mod_revision when known); exit 0 when the
/// asked fact holds, 1 when it does not.
pub(crate) fn print_explanation(
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
pub(crate) fn split_asked(asked: &str) -> (&str, Option<&str>) {
    match asked.split_once('=') {
        Some((k, v)) => (k.trim(), Some(v.trim())),
        None => (asked.trim(), None),
    }
}

/// `explain --controller URL`: asks a controller's `/explain`.
pub(crate) fn explain_served(url: &str, asked: &str, why_not: bool, depth: usize, format: Format) -> anyhow::Result<ExitCode> {
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
