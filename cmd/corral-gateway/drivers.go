package main

import (
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/corral-sandbox/corral/internal/gateway/driver"
	"github.com/corral-sandbox/corral/internal/gateway/driver/local"
)

// drivers are the drivers this binary offers besides "external": "local"
// when a corral binary is found (the flag, next to this executable, then
// PATH). Without one the gateway still serves supervisors that join.
func drivers(corralBin, dataDir string, workdirs []string, stateDir string, log *slog.Logger) map[string]driver.Driver {
	if corralBin == "" {
		corralBin = findCorral()
	}
	if corralBin == "" {
		log.Warn("no corral binary next to corral-gateway or in PATH: the local driver is off (give --corral PATH)")
		return nil
	}
	log.Info("local driver", "corral", corralBin, "workdirs", workdirs, "state_dir", stateDir)
	d := local.New(corralBin, dataDir)
	d.Workdirs, d.StateDir = workdirs, stateDir
	return map[string]driver.Driver{"local": d}
}

func findCorral() string {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), "corral")
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	p, err := exec.LookPath("corral")
	if err != nil {
		return ""
	}
	abs, err := filepath.Abs(p)
	if err != nil {
		return ""
	}
	return abs
}
