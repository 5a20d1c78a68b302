//! A `BufMut` that streams into a file, so a model is encoded straight to
//! disk without holding a second copy of its weights in memory.

use bytes::buf::UninitSlice;
use bytes::BufMut;
use std::io::Write;

pub(crate) struct StreamBuf<W: Write> {
    out: W,
    buf: Vec<u8>,
    filled: usize,
    pub(crate) error: Option<std::io::Error>,
    pub(crate) written: u64,
}

const CHUNK: usize = 1 << 20;

impl<W: Write> StreamBuf<W> {
    pub(crate) fn new(out: W) -> Self {
        StreamBuf {
            out,
            buf: vec![0; CHUNK],
            filled: 0,
            error: None,
            written: 0,
        }
    }

    fn flush_buf(&mut self) {
        if self.filled > 0 && self.error.is_none() {
            if let Err(e) = self.out.write_all(&self.buf[..self.filled]) {
                self.error = Some(e);
            }
        }
        self.written += self.filled as u64;
        self.filled = 0;
    }

    pub(crate) fn written_total(&self) -> u64 {
        self.written + self.filled as u64
    }

    pub(crate) fn finish(mut self) -> std::io::Result<W> {
        self.flush_buf();
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        self.out.flush()?;
        Ok(self.out)
    }
}

// SAFETY: `chunk_mut` hands out the unfilled tail of `buf`, which is always
// non-empty (it is flushed when full), and `advance_mut` only moves `filled`
// within what `chunk_mut` returned.
unsafe impl<W: Write> BufMut for StreamBuf<W> {
    fn remaining_mut(&self) -> usize {
        isize::MAX as usize
    }

    unsafe fn advance_mut(&mut self, cnt: usize) {
        self.filled += cnt;
        assert!(self.filled <= self.buf.len());
        if self.filled == self.buf.len() {
            self.flush_buf();
        }
    }

    fn chunk_mut(&mut self) -> &mut UninitSlice {
        if self.filled == self.buf.len() {
            self.flush_buf();
        }
        UninitSlice::new(&mut self.buf[self.filled..])
    }

    /// prost writes `bytes` fields (tensor data) with `put`, whose default
    /// copies through `chunk_mut` (into this buffer, a megabyte at a time);
    /// going through `put_slice` instead writes large chunks straight out.
    fn put<T: bytes::Buf>(&mut self, mut src: T)
    where
        Self: Sized,
    {
        while src.has_remaining() {
            let chunk = src.chunk();
            let n = chunk.len();
            self.put_slice(chunk);
            src.advance(n);
        }
    }

    fn put_slice(&mut self, src: &[u8]) {
        // Large payloads (tensor data) go straight to the writer.
        if src.len() >= CHUNK {
            self.flush_buf();
            if self.error.is_none() {
                if let Err(e) = self.out.write_all(src) {
                    self.error = Some(e);
                }
            }
            self.written += src.len() as u64;
            return;
        }
        let mut src = src;
        while !src.is_empty() {
            let room = self.buf.len() - self.filled;
            let n = room.min(src.len());
            self.buf[self.filled..self.filled + n].copy_from_slice(&src[..n]);
            self.filled += n;
            src = &src[n..];
            if self.filled == self.buf.len() {
                self.flush_buf();
            }
        }
    }
}
