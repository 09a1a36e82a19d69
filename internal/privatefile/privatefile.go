// Package privatefile writes files that only their owner may read (mode
// 0600), whole: the content is written and synced beside the path under a
// fresh name, put in place in one step, and the directory synced, so that
// after a crash the path holds either what it held before or all of the new
// content, never part of it.
package privatefile

import (
	"os"
	"path/filepath"
)

// Create creates path holding data, or fails with an error satisfying
// fs.ErrExist when path exists (then path is left as it was). Of several
// processes creating path at once, one succeeds.
func Create(path string, data []byte) error {
	return write(path, data, os.Link)
}

// Replace creates path holding data, or replaces the file there (whatever
// its mode was, the new file is 0600).
func Replace(path string, data []byte) error {
	return write(path, data, os.Rename)
}

// write writes data to a new file beside path and puts it in place with
// place (rename or link).
func write(path string, data []byte, place func(tmp, path string) error) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	err = f.Chmod(0o600)
	if err == nil {
		_, err = f.Write(data)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = place(tmp, path)
	}
	// Renamed, tmp is gone already; linked, or failed, it goes now.
	os.Remove(tmp)
	if err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
