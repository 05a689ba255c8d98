//! TLS for every gRPC link coordstore makes or takes (rustls, through
//! tonic): PEM files in, tonic's server and client configurations out.
//! Shared by the node (client and peer ports, peer channels), `ctl`, the
//! relay and the agent.

use std::path::Path;

use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

fn read(path: &Path, what: &str) -> Result<Vec<u8>, String> {
    let pem = std::fs::read(path).map_err(|e| format!("{what} {}: {e}", path.display()))?;
    if !String::from_utf8_lossy(&pem).contains("-----BEGIN ") {
        return Err(format!("{what} {}: not a PEM file", path.display()));
    }
    Ok(pem)
}

fn identity(cert: &Path, key: &Path) -> Result<Identity, String> {
    Ok(Identity::from_pem(
        read(cert, "certificate")?,
        read(key, "private key")?,
    ))
}

/// A server's TLS: its certificate chain and key; with `client_ca`, every
/// client must present a certificate that CA signed (mutual TLS).
pub fn server(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
) -> Result<ServerTlsConfig, String> {
    let mut cfg = ServerTlsConfig::new().identity(identity(cert, key)?);
    if let Some(ca) = client_ca {
        cfg = cfg.client_ca_root(Certificate::from_pem(read(ca, "client CA")?));
    }
    Ok(cfg)
}

/// A client's TLS: servers must present a certificate `ca` signed for the
/// host dialed (name or IP address); with `cert_key`, the client presents
/// that certificate (for servers that require one).
pub fn client(ca: &Path, cert_key: Option<(&Path, &Path)>) -> Result<ClientTlsConfig, String> {
    let mut cfg = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca, "CA")?));
    if let Some((cert, key)) = cert_key {
        cfg = cfg.identity(identity(cert, key)?);
    }
    Ok(cfg)
}

/// The URI of `addr` (HOST:PORT) with the scheme `tls` calls for.
pub fn uri(addr: &str, tls: bool) -> String {
    if tls {
        format!("https://{addr}")
    } else {
        format!("http://{addr}")
    }
}
