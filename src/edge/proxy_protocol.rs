//! PROXY protocol (stub until the identity branch lands).
use std::net::SocketAddr;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProxyHeader {
    pub source: Option<SocketAddr>,
    pub destination: Option<SocketAddr>,
    pub version: u8,
}

#[derive(Debug, thiserror::Error)]
pub enum ProxyProtocolError {
    #[error("timed out")]
    Timeout,
}

pub async fn read_header(
    _stream: &tokio::net::TcpStream,
    _deadline: Duration,
) -> Result<ProxyHeader, ProxyProtocolError> {
    Err(ProxyProtocolError::Timeout)
}
