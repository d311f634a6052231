// Package config loads a binary's typed configuration: defaults, then an
// optional TOML file (--config), then flags. Unknown keys in the file are an
// error that names them. Secret holds a password or token read from a file
// or an environment variable (ReadSecret) and never prints it.
package config

import (
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/BurntSushi/toml"
)

// Load fills cfg (a pointer to the config holding its defaults) from the
// --config file named in args, then from the flags that register adds, then
// runs validate. It returns the remaining positional arguments.
func Load(name string, args []string, cfg any, register func(fs *flag.FlagSet), validate func() error, out io.Writer) ([]string, error) {
	if path := configPath(args); path != "" {
		md, err := toml.DecodeFile(path, cfg)
		if err != nil {
			return nil, fmt.Errorf("config file %s: %w", path, err)
		}
		if und := md.Undecoded(); len(und) > 0 {
			keys := make([]string, len(und))
			for i, k := range und {
				keys[i] = k.String()
			}
			return nil, fmt.Errorf("config file %s: unknown keys: %s", path, strings.Join(keys, ", "))
		}
	}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	fs.String("config", "", "TOML configuration file (flags override it)")
	register(fs)
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if err := validate(); err != nil {
		return nil, fmt.Errorf("invalid configuration: %w", err)
	}
	return fs.Args(), nil
}

// configPath finds --config/-config in args without parsing the rest.
func configPath(args []string) string {
	for i, a := range args {
		for _, p := range []string{"--config", "-config"} {
			if a == p && i+1 < len(args) {
				return args[i+1]
			}
			if v, ok := strings.CutPrefix(a, p+"="); ok {
				return v
			}
		}
		if a == "--" {
			break
		}
	}
	return ""
}
