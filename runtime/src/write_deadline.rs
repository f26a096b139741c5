//! A connection whose writes may stall for at most a deadline: a client that stops reading
//! its answers (pipelining requests into a socket it never drains) would otherwise hold the
//! connection, and the server's slot for it, for ever — the header and body timeouts bound
//! only what the server reads (issue 58). Used by every HTTP server the project runs: the
//! metrics exporter, and `palisade api` / `ui`.

use std::future::Future as _;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// `S` whose write (or flush) that makes no progress for `limit` fails with
/// [`io::ErrorKind::TimedOut`], which ends the connection. Any progress starts the clock
/// again, so a slow reader that keeps reading is served.
pub struct WriteDeadline<S> {
    inner: S,
    limit: Duration,
    /// When the write that made no progress gives up.
    stalled: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<S> WriteDeadline<S> {
    /// `inner`, its stalled writes given up after `limit`.
    pub fn new(inner: S, limit: Duration) -> Self {
        Self {
            inner,
            limit,
            stalled: None,
        }
    }

    /// `Pending` while the stall is within the limit; the timeout once past it.
    fn stall<T>(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<T>> {
        let limit = self.limit;
        let deadline = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep(limit)));
        match deadline.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the client took no data for {limit:?}"),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }

    fn progressed<T>(
        &mut self,
        done: Poll<io::Result<T>>,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<T>> {
        match done {
            Poll::Pending => self.stall(cx),
            ready => {
                self.stalled = None;
                ready
            }
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WriteDeadline<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for WriteDeadline<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let done = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.progressed(done, cx)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let done = Pin::new(&mut self.inner).poll_flush(cx);
        self.progressed(done, cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let done = Pin::new(&mut self.inner).poll_shutdown(cx);
        self.progressed(done, cx)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let done = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.progressed(done, cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// A peer that never reads: the write gives up after the limit instead of waiting for
    /// ever; a peer that reads is served whatever the total time.
    #[tokio::test(start_paused = true)]
    async fn a_write_nobody_reads_gives_up_and_one_that_is_read_goes_through() {
        let (ours, mut theirs) = tokio::io::duplex(64);
        let mut ours = WriteDeadline::new(ours, Duration::from_secs(5));
        let stalled = ours.write_all(&[7u8; 1024]).await.unwrap_err();
        assert_eq!(stalled.kind(), io::ErrorKind::TimedOut);

        let (ours, mut reader) = tokio::io::duplex(64);
        let mut ours = WriteDeadline::new(ours, Duration::from_secs(5));
        let read = tokio::spawn(async move {
            let mut got = Vec::new();
            let mut buf = [0u8; 16];
            // Slowly, but always within the limit: 4 s between reads.
            while got.len() < 1024 {
                tokio::time::sleep(Duration::from_secs(4)).await;
                let n = reader.read(&mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            got.len()
        });
        ours.write_all(&[7u8; 1024]).await.unwrap();
        drop(ours);
        assert_eq!(read.await.unwrap(), 1024);
        let _ = theirs.read(&mut [0u8; 1]).await;
    }
}
