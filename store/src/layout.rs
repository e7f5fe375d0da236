//! The key layout one node's agent sees (DESIGN §2, §6): everything it
//! reads or writes lies under four prefixes named after its node, which is
//! what lets etcd hold it to them.
//!
//! ```text
//! placement/node/N/I = S                          what runs on N (read)
//! effective/node/N/instance/I/{service,image,port} its instances' specs (read)
//! effective/node/N/instance/I/config/K = V
//! effective/node/N/instance/I/secret/X =          a granted secret
//! effective/node/N/instance/I/volume/V = PATH     a mount
//! effective/node/N/instance/I/probe/P/{method,interval}
//! effective/node/N/volume/V/{size,persistent}
//! effective/node/N/secret/X =                     N needs secret X (the controller seals it)
//! secret/node/N/X = sealed to N's key             (read)
//! observed/node/N/…                               what N's agent sees (read and write)
//! ```

/// `placement/node/N/`: the instances placed on N.
pub fn placement_prefix(node: &str) -> String {
    format!("placement/node/{node}/")
}

/// `effective/node/N/`: the per-node view the rules derive.
pub fn view_prefix(node: &str) -> String {
    format!("effective/node/{node}/")
}

/// `secret/node/N/`: secret values sealed to N's public key.
pub fn secret_prefix(node: &str) -> String {
    format!("{SECRET_NODE}{node}/")
}

/// `observed/node/N/`: the only prefix N's agent writes.
pub fn observed_prefix(node: &str) -> String {
    format!("observed/node/{node}/")
}

/// The cluster clock (seconds), advanced by the leading controller: what
/// agents beat with and the rules judge heartbeats by.
pub const CLOCK: &str = "status/clock";
/// Secret values sealed with the cluster key, by name.
pub const SECRET_VALUE: &str = "secret/value/";
/// Secret values sealed to a node's key, by node and name.
pub const SECRET_NODE: &str = "secret/node/";
/// The field of `observed/node/N/` that holds N's public key.
pub const PUBKEY: &str = "pubkey";

/// `(node, secret)` of `effective/node/N/secret/X`.
pub fn node_secret_need(key: &str) -> Option<(&str, &str)> {
    let mut p = key.strip_prefix("effective/node/")?.split('/');
    match (p.next(), p.next(), p.next(), p.next()) {
        (Some(node), Some("secret"), Some(secret), None) if !node.is_empty() && !secret.is_empty() => Some((node, secret)),
        _ => None,
    }
}

/// `(node, secret)` of `secret/node/N/X`.
pub fn node_secret(key: &str) -> Option<(&str, &str)> {
    let (node, secret) = key.strip_prefix(SECRET_NODE)?.split_once('/')?;
    (!node.is_empty() && !secret.is_empty() && !secret.contains('/')).then_some((node, secret))
}

/// The node of `observed/node/N/pubkey`.
pub fn pubkey_node(key: &str) -> Option<&str> {
    let node = key.strip_prefix("observed/node/")?.strip_suffix("/pubkey")?;
    (!node.is_empty() && !node.contains('/')).then_some(node)
}

/// The secret of `secret/value/X`.
pub fn secret_value_name(key: &str) -> Option<&str> {
    key.strip_prefix(SECRET_VALUE).filter(|n| !n.is_empty() && !n.contains('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_parse_only_in_their_exact_shape() {
        assert_eq!(node_secret_need("effective/node/n1/secret/db"), Some(("n1", "db")));
        assert_eq!(node_secret_need("effective/node/n1/instance/web-0/secret/db"), None);
        assert_eq!(node_secret_need("effective/node//secret/db"), None);
        assert_eq!(node_secret("secret/node/n1/db"), Some(("n1", "db")));
        assert_eq!(node_secret("secret/node/n1/db/x"), None);
        assert_eq!(pubkey_node("observed/node/n1/pubkey"), Some("n1"));
        assert_eq!(pubkey_node("observed/node/n1/instance/x/pubkey"), None);
        assert_eq!(secret_value_name("secret/value/db"), Some("db"));
        assert_eq!(secret_value_name("secret/value/"), None);
        assert!(placement_prefix("n1").ends_with("/n1/") && observed_prefix("n1").starts_with("observed/node/n1/"));
    }
}
