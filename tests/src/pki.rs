//! Certificate authorities and certificates for TLS tests (rcgen), written
//! as PEM files into a directory.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// A certificate authority whose certificate is `dir/NAME-ca.pem`.
pub struct Ca {
    name: String,
    params: CertificateParams,
    key: KeyPair,
    dir: PathBuf,
    /// Its certificate (PEM file).
    pub cert: PathBuf,
}

/// A certificate and its key (PEM files).
#[derive(Clone, Debug)]
pub struct Leaf {
    /// The certificate chain.
    pub cert: PathBuf,
    /// The private key.
    pub key: PathBuf,
}

impl Ca {
    /// A new self-signed CA named `name`, its files in `dir`.
    pub fn new(dir: &Path, name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params
            .distinguished_name
            .push(DnType::CommonName, format!("{name} CA"));
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        let path = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&path, cert.pem()).expect("write CA");
        Ca {
            name: name.to_string(),
            params,
            key,
            dir: dir.to_path_buf(),
            cert: path,
        }
    }

    /// A certificate for `cn`, valid for `sans` (host names or IP
    /// addresses), for servers and clients both.
    pub fn issue(&self, cn: &str, sans: &[&str]) -> Leaf {
        let mut params =
            CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .expect("leaf params");
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate().expect("leaf key");
        let issuer = Issuer::from_params(&self.params, &self.key);
        let cert = params.signed_by(&key, &issuer).expect("sign leaf");
        let base = format!("{}-{cn}", self.name);
        let leaf = Leaf {
            cert: self.dir.join(format!("{base}.pem")),
            key: self.dir.join(format!("{base}-key.pem")),
        };
        std::fs::write(&leaf.cert, cert.pem()).expect("write certificate");
        std::fs::write(&leaf.key, key.serialize_pem()).expect("write key");
        leaf
    }
}
