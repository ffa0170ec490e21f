package replay

import (
	"database/sql"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	_ "github.com/lib/pq"

	"github.com/runnel-dev/runnel/internal/testtool"
)

// TestSQLOncePostgres is TestSQLOnce against a real PostgreSQL server that
// the test starts (initdb and pg_ctl of the Debian package `postgresql`, in a
// fresh directory on a free port; as root, through runuser -u postgres).
// Without PostgreSQL it skips, unless RUNNEL_REQUIRE_POSTGRESQL=1 (CI).
func TestSQLOncePostgres(t *testing.T) {
	testSQLOnce(t, startPostgres(t))
}

// pgBin finds a PostgreSQL server program: on PATH, or in the Debian
// package's versioned directory.
func pgBin(t *testing.T, name string) string {
	t.Helper()
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	if m, _ := filepath.Glob("/usr/lib/postgresql/*/bin/" + name); len(m) > 0 {
		return m[len(m)-1]
	}
	testtool.Missing(t, "postgresql", name+" not found on PATH nor in /usr/lib/postgresql/*/bin", "apt-get install postgresql")
	return ""
}

// startPostgres starts a throwaway server and returns a connection to it;
// the server is stopped and its directory removed at the end of the test.
func startPostgres(t *testing.T) *sql.DB {
	t.Helper()
	initdb, pgctl := pgBin(t, "initdb"), pgBin(t, "pg_ctl")
	dir, err := os.MkdirTemp("", "runnel-pg-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	// PostgreSQL refuses to run as root: run it as the postgres user.
	var prefix []string
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			testtool.Missing(t, "postgresql", "running as root and no postgres user to run the server as ("+err.Error()+")", "apt-get install postgresql creates it")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		prefix = []string{"runuser", "-u", "postgres", "--"}
	}
	run := func(args ...string) {
		t.Helper()
		args = append(prefix, args...)
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", args, err, out)
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	_ = l.Close()
	data := filepath.Join(dir, "data")
	run(initdb, "-D", data, "-U", "postgres", "--auth=trust", "--no-sync")
	run(pgctl, "-D", data, "-l", filepath.Join(dir, "log"), "-w", "-t", "60", "start",
		"-o", fmt.Sprintf("-p %d -c listen_addresses=127.0.0.1 -c unix_socket_directories=%s -c fsync=off", port, dir))
	t.Cleanup(func() {
		args := append(prefix, pgctl, "-D", data, "-m", "immediate", "-w", "stop")
		_ = exec.Command(args[0], args[1:]...).Run()
	})
	db, err := sql.Open("postgres", fmt.Sprintf("host=127.0.0.1 port=%d user=postgres dbname=postgres sslmode=disable", port))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	for deadline := time.Now().Add(30 * time.Second); ; {
		if err = db.Ping(); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("postgres on port %d: %v", port, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return db
}
