
Р

unrequested
	
skipped

name

	example-0

ids

Аю▓о

label

ц ▄у°


weights
бXа@╝FЮ@■ащ@

tags


t55
t32