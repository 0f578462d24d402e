//! Fixed-size chunks of dmable memory: bounce buffers for eager sends, and
//! staging segments for rendezvous on either side. One allocation, carved
//! into equal chunks, so that a peer registers it once and then always hits
//! its registration cache.

use unimem_dma::{DmaBuf, DmaError};

/// Index of a chunk in its pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Chunk(u32);

pub struct ChunkPool {
    memory: DmaBuf,
    chunk_size: usize,
    free: Vec<u32>,
}

impl ChunkPool {
    pub fn new(memory: DmaBuf, chunk_size: usize) -> ChunkPool {
        let count = memory.len() / chunk_size;
        ChunkPool {
            memory,
            chunk_size,
            // Popped from the back: hand out low chunks first, as warm ones.
            free: (0..count as u32).rev().collect(),
        }
    }

    /// Allocates `count` chunks of `chunk_size` bytes with `alloc`.
    pub fn allocate(
        alloc: impl FnOnce(usize) -> Result<DmaBuf, DmaError>,
        chunk_size: usize,
        count: usize,
    ) -> Result<ChunkPool, DmaError> {
        Ok(ChunkPool::new(
            alloc(chunk_size * count.max(1))?,
            chunk_size,
        ))
    }

    pub fn get(&mut self) -> Option<Chunk> {
        self.free.pop().map(Chunk)
    }

    pub fn put(&mut self, chunk: Chunk) {
        debug_assert!(!self.free.contains(&chunk.0), "chunk freed twice");
        self.free.push(chunk.0);
    }

    pub fn addr(&self, chunk: Chunk) -> *mut u8 {
        self.memory
            .as_ptr()
            .wrapping_add(chunk.0 as usize * self.chunk_size)
    }

    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    pub fn available(&self) -> usize {
        self.free.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use unimem_dma::{DmaRegion, RegionConfig};

    #[test]
    fn chunks_are_distinct_and_recycled() {
        let region = DmaRegion::for_process(&RegionConfig {
            job: crate::test_job(),
            segment_size: 1 << 20,
            max_size: 1 << 20,
        })
        .unwrap();
        let mut pool = ChunkPool::allocate(|len| region.alloc(len), 4096, 3).unwrap();
        let a = pool.get().unwrap();
        let b = pool.get().unwrap();
        let c = pool.get().unwrap();
        assert!(pool.get().is_none());
        assert_eq!(pool.addr(b) as usize - pool.addr(a) as usize, 4096);
        assert_eq!(pool.addr(c) as usize - pool.addr(b) as usize, 4096);
        pool.put(b);
        assert_eq!(pool.get(), Some(b));
    }
}
