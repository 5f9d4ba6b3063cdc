"""The Python client of a gateway's job API and its terminal output; needs neither gateway nor worker."""
