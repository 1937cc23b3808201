package check

import "testing"

// Agents post proposals: untrusted bytes.
func FuzzParseAddition(f *testing.F) {
	f.Add([]byte(`{"network_policies": {"npm": {"endpoints": [{"host": "registry.npmjs.org", "port": 443, "protocol": "rest", "access": "read-only"}], "binaries": [{"path": "/usr/bin/node"}]}}}`))
	f.Add([]byte("network_policies: {a: {endpoints: [{host: x.example.com, port: 443}]}}\nfilesystem_policy: {read_write: [/]}\n"))
	f.Add([]byte("network_policies: &a {x: *a}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		add, err := ParseAddition(data)
		if err != nil {
			return
		}
		if len(add) == 0 {
			t.Fatal("accepted a proposal that adds nothing")
		}
	})
}
