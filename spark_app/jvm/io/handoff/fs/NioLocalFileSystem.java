package io.handoff.fs;

import org.apache.hadoop.fs.LocalFileSystem;

/**
 * Hadoop's {@code file:} file system (checksummed, as {@link LocalFileSystem}) over {@link NioRawLocalFileSystem}:
 * what {@code fs.file.impl} names for a Handoff driver and its executors (handoff_spark/startup/local_fs.py).
 */
public class NioLocalFileSystem extends LocalFileSystem {
  public NioLocalFileSystem() {
    super(new NioRawLocalFileSystem());
  }
}
